// Wrap each word (a run without whitespace) of all code, blocks and inline, in a <span class="nobr">, so that a long
// line wraps at its spaces only: the browser's own rules would also break after a hyphen ("--weight-" / "decay").
// The text is unchanged, so the copy button copies it as written.
(function () {
  function words(code) {
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) nodes.push(walker.currentNode);
    for (const node of nodes) {
      if (!/\S/.test(node.data) || node.parentElement.classList.contains("nobr")) continue;
      const pieces = document.createDocumentFragment();
      for (const part of node.data.split(/(\s+)/)) {
        if (!part) continue;
        if (/^\s+$/.test(part)) {
          pieces.append(part);
        } else {
          const word = document.createElement("span");
          word.className = "nobr";
          word.textContent = part;
          pieces.append(word);
        }
      }
      node.replaceWith(pieces);
    }
  }
  function wrapAll() {
    document.querySelectorAll(".md-typeset code").forEach(words);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", wrapAll);
  else wrapAll();
})();
