// Monkey Web: runs' curves compared (the compare page, a sweep's page). One chart per
// metric, each run a line whose legend names the parameters that differ (lr=0.1 depth=8);
// hovering a curve picks its run out (the others fade, its name is shown); "Hide failed"
// leaves the failed runs out, "Ignore outliers" sizes the y range to the bulk of the
// points (a diverged run's 1e6 off the chart); "Group by" draws one line per value of a
// parameter, the mean of its runs, in a band of ± one standard deviation. Zoom, ticks and
// widths are the job page's (web.js: monkeyChartGroup).
"use strict";
window.addEventListener("load", function () {
  var box = document.getElementById("overlay"), source = document.getElementById("curves-data");
  if (!box || !source || !window.uPlot || !window.monkeyChartGroup) return;
  var runs = JSON.parse(source.textContent).runs;
  var hideFailed = document.getElementById("hide-failed");
  var noOutliers = document.getElementById("no-outliers");
  var groupBy = document.getElementById("group-by");
  var colours = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00",
    "#000000", "#999999", "#f0e442", "#882255"];
  var group = monkeyChartGroup(document.getElementById("syncx"));
  var series = null;  // per run: metric name -> {x, y, by}
  window.monkeyCharts = group.plots;
  // The view in the URL and remembered (view.js): hide failed, ignore outliers, zooming
  // together (for every comparison), the grouping and the zoom (this page's)
  if (window.monkeyView) {
    var view = monkeyView("curves", {failed: "kind", outliers: "kind", sync: "kind", group: "page", zoom: "page"});
    var syncx = document.getElementById("syncx");
    if (hideFailed) hideFailed.checked = view.get("failed") === "hide";
    if (noOutliers) noOutliers.checked = view.get("outliers") === "ignore";
    if (syncx) syncx.checked = view.get("sync") !== "0";
    if (groupBy) groupBy.value = [].some.call(groupBy.options, function (o) { return o.value === view.get("group"); }) ? view.get("group") : "";
    group.restore(view.all("zoom"));
    group.onzoom.push(function () { view.set("zoom", group.saved()); });
    if (hideFailed) hideFailed.addEventListener("change", function () { view.set("failed", hideFailed.checked ? "hide" : null); });
    if (noOutliers) noOutliers.addEventListener("change", function () { view.set("outliers", noOutliers.checked ? "ignore" : null); });
    if (syncx) syncx.addEventListener("change", function () { view.set("sync", syncx.checked ? null : "0"); });
    if (groupBy) groupBy.addEventListener("change", function () { view.set("group", groupBy.value); });
  }

  // The y range of the bulk of VALUES: beyond 3 interquartile ranges of the quartiles
  // (of their logarithms when all are positive, as a loss's are) is an outlier.
  function bulk(values) {
    var logs = values.every(function (v) { return v > 0; });
    var t = values.map(function (v) { return logs ? Math.log10(v) : v; }).sort(function (a, b) { return a - b; });
    var q = function (p) {
      var i = (t.length - 1) * p, lo = Math.floor(i);
      return t[lo] + (t[Math.min(lo + 1, t.length - 1)] - t[lo]) * (i - lo);
    };
    var q1 = q(0.25), q3 = q(0.75), k = 3 * (q3 - q1);
    var kept = t.filter(function (v) { return v >= q1 - k && v <= q3 + k; });
    var low = kept[0], high = kept[kept.length - 1];
    if (logs) { low = Math.pow(10, low); high = Math.pow(10, high); }
    var pad = (high - low) * 0.05 || Math.abs(high) * 0.1 || 1;
    return [low - pad, high + pad];
  }

  // Mean and ± one standard deviation, at each x of the joined DATA, of its columns COLS.
  function band(data, cols) {
    var mean = [], hi = [], lo = [];
    for (var i = 0; i < data[0].length; i++) {
      var ys = cols.map(function (c) { return data[c][i]; }).filter(function (y) { return y !== null && y !== undefined && isFinite(y); });
      if (!ys.length) { mean.push(null); hi.push(null); lo.push(null); continue; }
      var m = ys.reduce(function (a, b) { return a + b; }, 0) / ys.length;
      var sd = Math.sqrt(ys.reduce(function (a, y) { return a + (y - m) * (y - m); }, 0) / ys.length);
      mean.push(m); hi.push(m + sd); lo.push(m - sd);
    }
    return [mean, hi, lo];
  }

  function chart(name, shown, width) {
    var tables = [], drawn = [];
    shown.forEach(function (r) {
      var s = series[r.i][name];
      if (s) { tables.push([s.x, s.y]); drawn.push(r); }
    });
    if (!tables.length) return;
    var joined = uPlot.join(tables), by = series[drawn[0].i][name].by;
    var lines = [{label: by === "time" ? "seconds" : by}], data = [joined[0]], bands = [];
    var param = groupBy && groupBy.value;
    if (param) {  // one mean per value of PARAM, in a band of ± one standard deviation
      var values = [];
      drawn.forEach(function (r) {
        var v = r.params[param] === undefined ? "-" : r.params[param];
        if (values.indexOf(v) < 0) values.push(v);
      });
      values.forEach(function (v, g) {
        var cols = [];
        drawn.forEach(function (r, k) { if ((r.params[param] === undefined ? "-" : r.params[param]) === v) cols.push(k + 1); });
        var stats = band(joined, cols), colour = colours[g % colours.length], at = data.length;
        data.push(stats[0], stats[1], stats[2]);
        lines.push({label: param + "=" + v + " (mean of " + cols.length + ")", stroke: colour, width: 2, spanGaps: true});
        lines.push({label: param + "=" + v + " + std", stroke: colour + "40", width: 0.5, spanGaps: true, points: {show: false}});
        lines.push({label: param + "=" + v + " − std", stroke: colour + "40", width: 0.5, spanGaps: true, points: {show: false}});
        bands.push({series: [at + 1, at + 2], fill: colour + "26"});
      });
    } else {
      drawn.forEach(function (r, k) {
        data.push(joined[k + 1]);
        lines.push({label: r.label, stroke: colours[r.i % colours.length], width: 1.5, spanGaps: true});
      });
    }
    var figure = document.createElement("figure");
    figure.className = "chart";
    var title = document.createElement("h3");
    title.textContent = name;
    var hovered = document.createElement("figcaption");
    hovered.className = "hovered";
    hovered.setAttribute("aria-live", "polite");
    figure.appendChild(title);
    figure.appendChild(hovered);
    box.appendChild(figure);
    var y = {};
    if (noOutliers && noOutliers.checked) {
      var all = [];
      data.slice(1).forEach(function (ys) { ys.forEach(function (v) { if (v !== null && v !== undefined && isFinite(v)) all.push(v); }); });
      if (all.length) { var range = bulk(all); y.range = function () { return range; }; }
    }
    var u = group.draw(name, {
      width: width, height: 240, series: lines, bands: bands, scales: {y: y},
      legend: {live: false},  // the runs' names only: the hovered one is named above
      focus: {alpha: 0.25},  // the hovered curve stands out, the others fade
      cursor: {focus: {prox: 24}},
      hooks: {setSeries: [function (u, i, opts) {
        if (opts && opts.focus) hovered.textContent = i === null ? "" : u.series[i].label;
      }]}
    }, data, figure);
    var rows = u.root.querySelectorAll(".u-legend .u-series");  // a band's edges: not in the legend
    var skip = rows.length - u.series.length;  // -1: the x row not shown (legend.live off)
    bands.forEach(function (b) { b.series.forEach(function (k) { if (rows[k + skip]) rows[k + skip].hidden = true; }); });
  }

  function draw() {
    var width = Math.round(monkeyChartWidth(box));
    var shown = runs.map(function (r, i) { return Object.assign({i: i}, r); }).filter(function (r) {
      return !(hideFailed && hideFailed.checked && r.state === "failed");
    });
    var names = {};
    series.forEach(function (m) {  // the system's figures (sys/cpu...) left out, as the jobs list does
      Object.keys(m).forEach(function (n) { if (n.indexOf("sys/") !== 0) names[n] = 1; });
    });
    group.destroy();
    box.innerHTML = "";
    names = Object.keys(names).sort();
    if (!names.length) { box.innerHTML = '<p class="muted">no metrics logged</p>'; return; }
    names.forEach(function (name) { chart(name, shown, width); });
  }

  var width = Math.round(monkeyChartWidth(box));
  Promise.all(runs.map(function (r) {
    return fetch("/web/jobs/" + encodeURIComponent(r.job) + "/metrics?width=" + width, {credentials: "same-origin"})
      .then(function (a) { return a.ok ? a.json() : {}; }).catch(function () { return {}; });
  })).then(function (all) {
    series = all;
    draw();
    [hideFailed, noOutliers, groupBy].forEach(function (c) { if (c) c.addEventListener("change", draw); });
  });
});
