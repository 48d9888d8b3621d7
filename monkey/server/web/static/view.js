// Monkey Web: a page's view (chart options, a zoom, a sort, a brush) lives in its URL's
// query, so a link reproduces it ("this chart, zoomed, smoothed 0.9"), and is remembered
// in this browser (localStorage) for a page opened without one. The URL follows each change
// by history.replaceState: no reload, no new history entry.
"use strict";
// monkeyView(KIND, KEYS): the view of one part of a page. KIND names the part ("job",
// "curves"...); KEYS maps each query parameter it owns to where it is remembered: "kind"
// for every page of the kind (log y, smoothing), "page" for this page alone (a zoom, a
// brush). A URL that holds any of KEYS is the whole view (the others: defaults); without
// any, the remembered one is shown and written into the URL.
window.monkeyView = function (kind, keys) {
  var names = Object.keys(keys), given = new URLSearchParams(location.search), state = {};
  var slot = function (scope) { return "monkey.view." + kind + (scope === "page" ? " " + location.pathname : ""); };
  var read = function (scope) {
    try {
      var kept = JSON.parse(localStorage.getItem(slot(scope)) || "{}");
      return kept && typeof kept === "object" ? kept : {};
    } catch (e) { return {}; }  // storage refused (a private window) or garbled
  };
  var fromUrl = names.some(function (k) { return given.has(k); });
  if (fromUrl) names.forEach(function (k) { if (given.has(k)) state[k] = given.getAll(k); });
  else ["kind", "page"].forEach(function (scope) {
    var kept = read(scope);
    names.forEach(function (k) {
      if (keys[k] === scope && Array.isArray(kept[k]) && kept[k].length) state[k] = kept[k].map(String);
    });
  });
  function save() {  // each parameter where it was in the URL (a link stays the same)
    var url = new URLSearchParams(), done = {};
    var put = function (k) { done[k] = 1; (state[k] || []).forEach(function (v) { url.append(k, v); }); };
    new URLSearchParams(location.search).forEach(function (v, k) {
      if (!(k in keys)) url.append(k, v);
      else if (!done[k]) put(k);
    });
    names.forEach(function (k) { if (!done[k]) put(k); });
    var query = url.toString();
    history.replaceState(history.state, "", location.pathname + (query ? "?" + query : "") + location.hash);
    ["kind", "page"].forEach(function (scope) {
      var kept = {};
      names.forEach(function (k) { if (keys[k] === scope && state[k]) kept[k] = state[k]; });
      try {
        if (Object.keys(kept).length) localStorage.setItem(slot(scope), JSON.stringify(kept));
        else localStorage.removeItem(slot(scope));
      } catch (e) { /* not remembered: the URL still holds it */ }
    });
  }
  save();
  return {
    restored: !fromUrl && Object.keys(state).length > 0,  // shown from memory, not the URL
    get: function (k) { return state[k] ? state[k][0] : null; },
    all: function (k) { return (state[k] || []).slice(); },
    set: function (k, value) {  // null, "" or []: the default, left out of the URL
      var list = value === null || value === undefined || value === "" ? [] : [].concat(value).map(String);
      if (list.length) state[k] = list; else delete state[k];
      save();
    }
  };
};
