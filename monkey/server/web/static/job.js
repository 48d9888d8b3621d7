// Monkey Web's job page extras: "Copy" buttons put a command line on the clipboard.
"use strict";
document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
  button.addEventListener("click", function () {
    var line = document.getElementById(button.dataset.copy);
    if (!line) return;
    var done = function () { button.textContent = "Copied"; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(line.textContent).then(done, function () { select(line); });
    } else {
      select(line);
    }
  });
});
function select(node) {
  var range = document.createRange();
  range.selectNodeContents(node);
  var picked = window.getSelection();
  picked.removeAllRanges();
  picked.addRange(range);
}
