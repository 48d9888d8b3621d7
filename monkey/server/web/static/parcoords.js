// Monkey Web: a sweep's parallel coordinates, drawn as SVG (no library: a few hundred
// lines of d3 would be a 90 KB bundle for one chart). One axis per parameter and the
// metric, one line per run coloured by the metric (viridis: safe for colour blindness and
// in grey); drag along an axis to keep the runs crossing it there, in the chart and in
// the runs table; click an axis to clear its selection (or, by keyboard, see `keys`).
"use strict";
(function () {
  var box = document.getElementById("parcoords"), source = document.getElementById("pc-data");
  if (!box || !source) return;
  var data, NS = "http://www.w3.org/2000/svg";
  var VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  var TOP = 34, BOTTOM = 26, HEIGHT = 320, NONE = 14;  // NONE: below an axis, runs without a value
  var ROW = 16;  // a second row of axis titles, when one row cannot hold them (a phone)
  var PLOT = HEIGHT - TOP - BOTTOM - NONE;  // the axes' height (TOP grows with two rows)
  var brushes = {}, paths = [], count = document.getElementById("pc-count");
  var table, best, low, high;
  // The brushes in the URL and remembered for this sweep (view.js): "AXIS:low:high" each,
  // in the axis's values (a numeric one) or its fraction of the height (categories), so a
  // link keeps its runs however wide the chart is drawn
  var view = window.monkeyView ? monkeyView("parcoords", {brush: "page"}) : null;

  // The runs, the runs table and the best run: read again when live.js swapped them in.
  var drawnFrom = null;  // the data's text the chart was drawn from
  function load() {
    drawnFrom = document.getElementById("pc-data").textContent;
    data = JSON.parse(drawnFrom);
    table = document.querySelector("table.runs tbody");
    var row = document.querySelector("tr.best");
    best = row ? row.dataset.job : null;
    var metrics = data.runs.map(function (r) { return r.m; }).filter(function (m) { return m !== null; });
    low = Math.min.apply(null, metrics);
    high = Math.max.apply(null, metrics);
  }

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(e);
    return e;
  }
  function colour(t) {
    var at = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1), i = Math.min(Math.floor(at), VIRIDIS.length - 2);
    var f = at - i, a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return "rgb(" + [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); }).join(",") + ")";
  }
  // An axis's position of a value, 0 (bottom) to 1 (top); null without a value.
  function unit(axis, v) {
    if (v === null || v === undefined) return null;
    if (axis.kind === "cat") {
      var n = axis.levels.length;
      return n < 2 ? 0.5 : axis.levels.indexOf(v) / (n - 1);
    }
    if (axis.max === axis.min) return 0.5;
    if (axis.log) return (Math.log(v) - Math.log(axis.min)) / (Math.log(axis.max) - Math.log(axis.min));
    return (v - axis.min) / (axis.max - axis.min);
  }
  function label(v) {
    if (typeof v !== "number") return String(v);
    return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(1) : String(+v.toPrecision(4));
  }
  function ticks(axis) {
    if (axis.kind === "cat") return axis.levels;
    if (axis.max === axis.min) return [axis.min];
    var out = [];
    for (var i = 0; i <= 4; i++) {
      var t = i / 4;
      out.push(axis.log ? Math.exp(Math.log(axis.min) + t * (Math.log(axis.max) - Math.log(axis.min))) : axis.min + t * (axis.max - axis.min));
    }
    return out;
  }

  // A brush's edge Y (in the chart's units) as a link keeps it, and back: a numeric
  // axis's value there, else the fraction of the axis (1: its top, below 0: "none").
  function valued(axis) { return axis.kind !== "cat" && axis.max > axis.min; }
  function edgeOf(axis, y) {
    var t = (TOP + PLOT - y) / PLOT;
    if (!valued(axis)) return +t.toPrecision(6);
    if (axis.log) return +Math.exp(Math.log(axis.min) + t * (Math.log(axis.max) - Math.log(axis.min))).toPrecision(6);
    return +(axis.min + t * (axis.max - axis.min)).toPrecision(6);
  }
  function yOf(axis, v) {
    var t = !valued(axis) ? v : axis.log ? (Math.log(v) - Math.log(axis.min)) / (Math.log(axis.max) - Math.log(axis.min)) : (v - axis.min) / (axis.max - axis.min);
    return TOP + PLOT - t * PLOT;
  }
  function settle(axis, b) {  // B as the link will give it back
    var y = [yOf(axis, edgeOf(axis, b[0])), yOf(axis, edgeOf(axis, b[1]))];
    return [Math.min(y[0], y[1]), Math.max(y[0], y[1])];
  }
  function restore() {
    view.all("brush").forEach(function (entry) {
      var parts = entry.split(":"), high = parseFloat(parts.pop()), low = parseFloat(parts.pop());
      var axis = data.axes.filter(function (a) { return a.name === parts.join(":"); })[0];
      if (!axis || !isFinite(low) || !isFinite(high) || (axis.log && (low <= 0 || high <= 0))) return;
      var y = [yOf(axis, low), yOf(axis, high)];
      brushes[axis.name] = [Math.min(y[0], y[1]), Math.max(y[0], y[1])];
    });
  }
  function remember() {
    if (!view) return;
    view.set("brush", data.axes.filter(function (a) { return brushes[a.name]; }).map(function (a) {
      var b = brushes[a.name], ends = [edgeOf(a, b[1]), edgeOf(a, b[0])];  // low, high
      return a.name + ":" + Math.min(ends[0], ends[1]) + ":" + Math.max(ends[0], ends[1]);
    }));
  }
  function title(axis) {
    return axis.name.replace(/^param:/, "").replace(/:best$/, " best") + (axis.log ? " (log)" : "");
  }
  // The axis titles' rows and texts: one row when the titles fit side by side, else two
  // (every other axis a row up); a title still wider than its room is shortened with "…"
  // (the whole name is its tooltip and the axis's label).
  function titles(svg, xs, width) {
    var n = xs.length, names = data.axes.map(title), texts = names.slice();
    var room = el("g", {"class": "axis"}, svg);  // styled as the titles will be
    var probe = names.map(function (t, i) {
      var e = el("text", {x: xs[i], y: 0, "class": "name", "text-anchor": anchor(i, n)}, room);
      e.textContent = t;
      return e;
    });
    function span(i) {
      var w = probe[i].getComputedTextLength(), a = anchor(i, n);
      return a === "start" ? [xs[i], xs[i] + w] : a === "end" ? [xs[i] - w, xs[i]] : [xs[i] - w / 2, xs[i] + w / 2];
    }
    function clash(i, j) { return span(i)[1] + 8 > span(j)[0]; }
    function shorten(i) {
      texts[i] = texts[i].replace(/…$/, "").slice(0, -1) + "…";
      probe[i].textContent = texts[i];
    }
    var rows = 1;
    for (var i = 1; i < n; i++) if (clash(i - 1, i)) rows = 2;
    for (i = 0; i < n; i++) {
      while (texts[i].length > 2 && (span(i)[0] < 0 || span(i)[1] > width)) shorten(i);
      if (i < rows) continue;
      while (clash(i - rows, i) && (texts[i].length > 2 || texts[i - rows].length > 2)) {
        shorten(texts[i].length >= texts[i - rows].length ? i : i - rows);
      }
    }
    svg.removeChild(room);
    return {rows: rows, names: names, texts: texts};
  }
  function anchor(i, n) { return i === 0 ? "start" : i === n - 1 && n > 1 ? "end" : "middle"; }

  function draw() {
    box.innerHTML = "";
    paths = [];
    var width = Math.max(280, box.clientWidth), n = data.axes.length;
    var left = 40, right = 40, step = n > 1 ? (width - left - right) / (n - 1) : 0;
    var svg = el("svg", {viewBox: "0 0 " + width + " " + HEIGHT, height: HEIGHT}, box);
    var xs = data.axes.map(function (_, i) { return n > 1 ? left + i * step : width / 2; });
    var head = titles(svg, xs, width);
    var was = [TOP, PLOT];
    TOP = 34 + (head.rows - 1) * ROW;
    PLOT = HEIGHT - TOP - BOTTOM - NONE;
    var plot = PLOT;
    if (TOP !== was[0]) Object.keys(brushes).forEach(function (k) {  // the same part of each axis
      brushes[k] = brushes[k].map(function (y) { return TOP + (y - was[0]) * PLOT / was[1]; });
    });
    var ys = function (axis, v) {
      var u = unit(axis, v);
      return u === null ? TOP + plot + NONE : TOP + (1 - u) * plot;
    };
    var lines = el("g", {"class": "lines"}, svg);
    data.runs.forEach(function (run) {
      var d = run.v.map(function (v, i) { return (i ? "L" : "M") + xs[i].toFixed(1) + "," + ys(data.axes[i], v).toFixed(1); }).join("");
      var p = el("path", {d: d, "class": "run" + (run.m === null ? " none" : "") + (run.job === best ? " best" : ""), "data-job": run.job}, lines);
      if (run.m !== null) p.setAttribute("stroke", colour(high > low ? (run.m - low) / (high - low) : 1));
      el("title", {}, p).textContent = run.job + (data.metric ? ": " + data.metric + " " + (run.m === null ? "none" : label(run.m)) : "");
      paths.push({run: run, path: p});
    });
    var bestPath = lines.querySelector(".best");
    if (bestPath) lines.appendChild(bestPath);  // on top
    data.axes.forEach(function (axis, i) {
      var g = el("g", {"class": "axis", "data-axis": axis.name}, svg);
      el("line", {x1: xs[i], x2: xs[i], y1: TOP, y2: TOP + plot}, g);
      var up = head.rows === 2 && i % 2 === 1 ? ROW : 0;
      var name = el("text", {x: xs[i], y: TOP - 18 - up, "text-anchor": anchor(i, n), "class": "name"}, g);
      name.textContent = head.texts[i];
      if (head.texts[i] !== head.names[i]) el("title", {}, name).textContent = head.names[i];
      ticks(axis).forEach(function (t) {
        var y = ys(axis, t);
        el("line", {x1: xs[i] - 3, x2: xs[i] + 3, y1: y, y2: y}, g);
        el("text", {x: xs[i] + (i === n - 1 && n > 1 ? -6 : 6), y: y + 4, "text-anchor": i === n - 1 && n > 1 ? "end" : "start"}, g).textContent = label(t);
      });
      if (data.runs.some(function (r) { return r.v[i] === null; })) {
        el("text", {x: xs[i] + 6, y: TOP + plot + NONE + 4}, g).textContent = "none";
      }
      var rect = el("rect", {"class": "brush", x: xs[i] - 8, width: 16, y: 0, height: 0, visibility: "hidden"}, g);
      show(rect, brushes[axis.name]);
      keys(g, axis, rect, TOP - 6, TOP + plot + NONE + 6);
      var hit = el("rect", {"class": "hit", x: xs[i] - 14, width: 28, y: TOP - 6, height: plot + NONE + 12}, g);
      var start = null;
      var at = function (e) {
        var r = svg.getBoundingClientRect();
        return (e.clientY - r.top) * HEIGHT / r.height;
      };
      hit.addEventListener("pointerdown", function (e) {
        start = at(e);
        hit.setPointerCapture(e.pointerId);
        e.preventDefault();
      });
      hit.addEventListener("pointermove", function (e) {
        if (start === null) return;
        var y = at(e), y0 = Math.min(start, y), y1 = Math.max(start, y);
        rect.setAttribute("y", y0); rect.setAttribute("height", y1 - y0); rect.setAttribute("visibility", "visible");
      });
      hit.addEventListener("pointerup", function (e) {
        if (start === null) return;
        var y = at(e), y0 = Math.min(start, y), y1 = Math.max(start, y);
        start = null;
        if (y1 - y0 < 3) delete brushes[axis.name];
        else brushes[axis.name] = settle(axis, [y0, y1]);
        show(rect, brushes[axis.name]);
        filter();
        remember();
      });
      axis.y = function (v) { return ys(axis, v); };
    });
    filter();
  }

  function show(rect, b) {
    rect.setAttribute("visibility", b ? "visible" : "hidden");
    if (b) { rect.setAttribute("y", b[0]); rect.setAttribute("height", b[1] - b[0]); }
  }

  // The keyboard's way to brush: Tab to an axis; the arrows select a band (a quarter of
  // the axis, from the end they point to) and move it a twentieth at a time, Shift with
  // the arrows moves its lower edge (narrower, wider); Escape or Delete clears it.
  function keys(g, axis, rect, top, bottom) {
    g.setAttribute("tabindex", "0");
    g.setAttribute("role", "group");
    g.setAttribute("aria-label", axis.name + " axis: arrows select a band of runs, Shift+arrows resize it, Escape clears");
    g.addEventListener("keydown", function (e) {
      var b = brushes[axis.name], step = (bottom - top) / 20, dir = e.key === "ArrowUp" ? -1 : 1;
      if (e.key === "Escape" || e.key === "Delete") {
        if (!b) return;
        delete brushes[axis.name];
      } else if (e.key === "ArrowUp" || e.key === "ArrowDown") {
        var band = (bottom - top) / 4;
        if (!b) b = dir < 0 ? [top, top + band] : [bottom - band, bottom];
        else if (e.shiftKey) b = [b[0], Math.min(bottom, Math.max(b[0] + step, b[1] + dir * step))];
        else {
          var y0 = Math.min(bottom - (b[1] - b[0]), Math.max(top, b[0] + dir * step));
          b = [y0, y0 + b[1] - b[0]];
        }
        brushes[axis.name] = settle(axis, b);
      } else return;
      e.preventDefault();
      show(rect, brushes[axis.name]);
      filter();
      remember();
    });
  }

  // Keep the runs crossing every brushed axis inside its brush; hide the others' rows.
  function filter() {
    var kept = 0, shown = {};
    paths.forEach(function (p) {
      var ok = data.axes.every(function (axis, i) {
        var b = brushes[axis.name];
        if (!b) return true;
        var y = axis.y(p.run.v[i]);
        return y >= b[0] && y <= b[1];
      });
      p.path.classList.toggle("off", !ok);
      if (ok) { kept++; shown[p.run.job] = 1; }
    });
    if (table) table.querySelectorAll("tr[data-job]").forEach(function (tr) { tr.hidden = !shown[tr.dataset.job]; });
    var csv = document.getElementById("runs-csv");  // the CSV holds the selected runs only
    if (csv) {
      var url = new URL(csv.href);
      url.searchParams.delete("job");
      if (kept < paths.length) Object.keys(shown).forEach(function (j) { url.searchParams.append("job", j); });
      csv.href = url.toString();
    }
    count.textContent = kept === paths.length ? paths.length + " runs" : kept + " of " + paths.length + " runs selected";
  }

  document.getElementById("pc-clear").addEventListener("click", function () { brushes = {}; draw(); remember(); });
  var drawnAt = 0;
  window.addEventListener("resize", function () {
    if (Math.abs(box.clientWidth - drawnAt) > 20) { drawnAt = box.clientWidth; draw(); }
  });
  // A run that ended or moved: drawn again from the new data, the selections kept; when
  // only the table changed, its rows are filtered again (a brush being dragged goes on).
  document.addEventListener("monkey:refreshed", function () {
    if (document.getElementById("pc-data").textContent !== drawnFrom) {
      load();
      draw();
      return;
    }
    table = document.querySelector("table.runs tbody");
    filter();
  });
  drawnAt = box.clientWidth;
  load();
  if (view) restore();
  draw();
})();
