// Monkey Web: a page's live parts (the elements marked data-refresh: a job's state line and
// actions, a sweep's progress, the providers' tables) follow the jobs without a reload. A
// light poll of /web/changed each second (no connection held, unlike a feed: a browser
// keeps only 6 per server), or while the page has a feed open anyway (a job's log) what it
// says ("monkey:changed" on the document; "monkey:unfed" when it closes); when the jobs
// moved, the page is fetched again and each live part whose HTML changed is swapped in
// (rendered and escaped by the server), and then "monkey:refreshed" is sent on the document.
"use strict";
(function () {
  if (!document.querySelector("[data-refresh]") || !window.fetch) return;
  var last = null, busy = false, fed = false;
  function refresh() {
    busy = true;
    fetch(location.href, {credentials: "same-origin"}).then(function (r) {
      return r.ok && !r.redirected ? r.text() : null;
    }).then(function (html) {
      if (html === null) return;
      var fresh = new DOMParser().parseFromString(html, "text/html"), swapped = false;
      document.querySelectorAll("[data-refresh]").forEach(function (part) {
        var now = part.id && fresh.getElementById(part.id);
        if (!now || now.innerHTML === part.innerHTML) return;
        swapped = true;
        var focused = part.contains(document.activeElement) && document.activeElement.className;
        part.innerHTML = now.innerHTML;
        if (focused) {  // the focus stays on the same control when it is still there
          var again = part.querySelector("." + focused.split(" ")[0]);
          if (again) again.focus();
        }
      });
      // what a page's scripts drew from the parts (a sweep's parallel coordinates) follows
      if (swapped) document.dispatchEvent(new Event("monkey:refreshed"));
    }).catch(function () {}).finally(function () { busy = false; });
  }
  function moved(at) {
    at = JSON.stringify(at);
    if (at !== last) { last = at; refresh(); }  // the first answer too: what moved since the page was made
  }
  function tick() {
    if (document.hidden || busy || fed) return;
    fetch("/web/changed", {credentials: "same-origin"}).then(function (r) {
      return r.ok ? r.json() : null;
    }).then(function (d) {
      if (d && !fed) moved(d.at);
    }).catch(function () {});
  }
  document.addEventListener("monkey:changed", function (e) { fed = true; moved(e.detail); });
  document.addEventListener("monkey:unfed", function () { fed = false; });
  setInterval(tick, 1000);
  tick();
  // the page's parts again, now (a sort restored into the URL: view.js, web.js)
  window.monkeyRefresh = function () { if (!busy) refresh(); else setTimeout(window.monkeyRefresh, 100); };
})();
