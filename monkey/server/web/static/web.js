// Monkey Web: live rows on the jobs page, the live log and the charts on a job page.
"use strict";
(function () {
  // -- a destructive action (data-confirm: a job's Cancel, a sweep's "Cancel all"...) asks
  // first, naming what it acts on and what is lost; {ran} its running time at the click:
  // data-ran seconds at data-now (the server's clock), growing with data-live runs running
  var first = document.querySelector("form[data-now]");
  var skew = first ? Date.now() / 1000 - parseFloat(first.dataset.now) : 0;  // this clock minus the server's
  var runTime = function (s) {  // as the CLI and the dashboard show one (models.run_time)
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    if (s < 10) return Math.max(0, s).toFixed(1) + "s";
    s = Math.floor(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + two(s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + two(Math.floor(s % 3600 / 60)) + "m";
    return Math.floor(s / 86400) + "d" + two(Math.floor(s % 86400 / 3600)) + "h";
  };
  document.addEventListener("submit", function (e) {
    var form = e.target, d = form.dataset || {};
    if (!d.confirm) return;
    var since = Math.max(0, Date.now() / 1000 - skew - parseFloat(d.now));
    var ran = parseFloat(d.ran) + parseInt(d.live, 10) * since;
    if (!window.confirm(d.confirm.replace("{ran}", runTime(ran)))) e.preventDefault();
  });

  // -- jobs page: reload the rows whenever a job changes (server-sent events)
  var jobs = document.getElementById("jobs");
  if (jobs && window.EventSource) {
    var busy = false, again = false;
    var reload = function () {
      if (busy) { again = true; return; }
      busy = true;
      var q = new URLSearchParams(location.search); q.set("fragment", "1");
      fetch("/web/jobs?" + q.toString(), {credentials: "same-origin"}).then(function (r) {
        if (r.redirected || !r.ok) return null;
        return r.text();
      }).then(function (html) {
        if (html === null) return;
        var picked = {};
        jobs.querySelectorAll("input[name=job]:checked").forEach(function (b) { picked[b.value] = 1; });
        jobs.innerHTML = html;  // rendered and escaped by the server
        jobs.querySelectorAll("input[name=job]").forEach(function (b) { b.checked = !!picked[b.value]; });
      }).finally(function () {
        busy = false;
        if (again) { again = false; reload(); }
      });
    };
    var changes = null;
    var watch = function () {
      changes = new EventSource("/web/events");
      changes.addEventListener("changed", reload);
    };
    watch();
    // A hidden page gives its connection back (a browser keeps 6 per server: a seventh
    // open page would wait for one) and catches up when shown again.
    document.addEventListener("visibilitychange", function () {
      if (document.hidden && changes) { changes.close(); changes = null; }
      else if (!document.hidden && !changes) { watch(); reload(); }
    });
  }

  // -- a sweep's page: its runs table's sort in the URL (the server sorts) and remembered
  // for this sweep (view.js); a sort remembered is fetched in place (live.js), no reload
  if (document.getElementById("sweep-runs") && window.monkeyView) {
    var order = monkeyView("sweep", {sort: "page", reverse: "page"});
    if (order.restored && window.monkeyRefresh) window.monkeyRefresh();
  }

  // -- job page: the output followed live
  var log = document.getElementById("log");
  if (log && window.EventSource) {
    var follow = document.getElementById("follow"), pause = document.getElementById("pause");
    var status = document.getElementById("logstate"), held = [], paused = false;
    // A carriage return rewrites its line, as in a terminal: the server sends each piece's
    // last redraw after a "\r" (outside any tag), and what the log has of that line goes.
    var eraseLine = function () {  // from the end back to the last newline
      var node = log.lastChild;
      while (node) {
        if (node.nodeType === Node.TEXT_NODE) {
          var cut = node.data.lastIndexOf("\n");
          node.data = node.data.slice(0, cut + 1);
          if (cut >= 0) return;
        } else if (node.lastChild) { node = node.lastChild; continue; }
        while (node !== log && !node.previousSibling) node = node.parentNode;
        if (node === log) return;
        node = node.previousSibling;
      }
    };
    var add = function (items) {
      items.forEach(function (m) {
        m.h.split("\r").forEach(function (h, k) {
          if (k) eraseLine();
          var span = document.createElement("span");
          span.className = m.s;
          span.innerHTML = h;  // escaped by the server before colours became spans
          log.appendChild(span);
        });
      });
      if (follow.checked) log.scrollTop = log.scrollHeight;
    };
    // Which of the job's streams the log shows (stdout, stderr or both)
    var streams = document.getElementById("streams");
    if (streams) streams.addEventListener("change", function () { log.dataset.only = streams.value; });
    // "First error": the first line of a Traceback or naming an error, shown and marked
    var firstError = document.getElementById("first-error"), ERROR = /Traceback \(most recent call last\)|\b[A-Za-z_][\w.]*(Error|Exception)\b/;
    var errorIn = function () {
      var walker = document.createTreeWalker(log, NodeFilter.SHOW_TEXT), node;
      while ((node = walker.nextNode())) {
        if (!node.parentElement.offsetParent) continue;  // a stream not shown
        var hit = ERROR.exec(node.data);
        if (hit) { var r = new Range(); r.setStart(node, hit.index); r.setEnd(node, hit.index + hit[0].length); return r; }
      }
      return null;
    };
    if (firstError) firstError.addEventListener("click", function () {
      var at = errorIn();
      if (!at) { status.textContent = "no Traceback or Error in the output shown"; return; }
      follow.checked = false;  // stay on it while lines arrive
      if (window.CSS && CSS.highlights) CSS.highlights.set("found-here", new Highlight(at));
      var box = at.getBoundingClientRect(), frame = log.getBoundingClientRect();
      log.scrollTop += box.top - frame.top - 8;
      log.focus();
    });
    // Lines are drawn at most 5 times a second, however fast they come: a page following
    // a chatty job stays cheap (each draw lays out and paints the log again).
    var pending = [], timer = null;
    var queue = function (m) {
      pending.push(m);
      if (timer === null) timer = setTimeout(function () { timer = null; add(pending); pending = []; }, 200);
    };
    pause.addEventListener("click", function () {
      paused = !paused;
      pause.setAttribute("aria-pressed", String(paused));
      pause.textContent = paused ? "Resume output (" + held.length + " new)" : "Pause output";
      if (!paused) { add(held); held = []; }
    });
    var feed = null, at = "", ended = false;
    // While the feed is open it says when jobs changed (live.js need not poll for it)
    var unfed = function () { document.dispatchEvent(new Event("monkey:unfed")); };
    var open = function () {
      feed = new EventSource(log.dataset.feed + (at ? "?from=" + encodeURIComponent(at) : ""));
      feed.addEventListener("changed", function (e) {
        document.dispatchEvent(new CustomEvent("monkey:changed", {detail: JSON.parse(e.data)}));
      });
      feed.addEventListener("error", unfed);  // reconnecting: polled meanwhile
      feed.onmessage = function (e) {
        at = e.lastEventId || at;  // the byte offsets reached: where a reopened feed resumes
        var m = JSON.parse(e.data);
        if (paused) { held.push(m); pause.textContent = "Resume output (" + held.length + " new)"; }
        else queue(m);
      };
      feed.addEventListener("end", function (e) {
        feed.close();
        unfed();
        ended = true;
        status.textContent = "the job has ended (" + JSON.parse(e.data).state + ")";
        if (charts && charts.dataset.live === "1") refresh();  // its last points
      });
      feed.addEventListener("failure", function (e) {
        feed.close();
        unfed();
        ended = true;
        status.textContent = JSON.parse(e.data).error;
      });
    };
    open();
    // Find in the output: every match highlighted (CSS highlights: the text is untouched),
    // Enter moves to the next one.
    var find = document.getElementById("find"), found = document.getElementById("found");
    var matches = [], here = -1;
    var search = function () {
      matches = [];
      var text = find.value.toLowerCase();
      if (text && window.CSS && CSS.highlights) {
        var walker = document.createTreeWalker(log, NodeFilter.SHOW_TEXT), node;
        while ((node = walker.nextNode())) {
          var hay = node.data.toLowerCase(), at = hay.indexOf(text);
          while (at >= 0) {
            var r = new Range();
            r.setStart(node, at);
            r.setEnd(node, at + text.length);
            matches.push(r);
            at = hay.indexOf(text, at + text.length);
          }
        }
      }
      here = -1;
      if (window.CSS && CSS.highlights) {
        CSS.highlights.set("found", new Highlight(...matches));
        CSS.highlights.delete("found-here");
      }
      found.textContent = text ? matches.length + " found" : "";
    };
    find.addEventListener("input", search);
    find.addEventListener("keydown", function (e) {
      if (e.key !== "Enter" || !matches.length) return;
      e.preventDefault();
      here = (here + 1) % matches.length;
      CSS.highlights.set("found-here", new Highlight(matches[here]));
      follow.checked = false;  // stay on the match while lines arrive
      var box = matches[here].getBoundingClientRect(), frame = log.getBoundingClientRect();
      log.scrollTop += box.top - frame.top - log.clientHeight / 2;
      found.textContent = (here + 1) + " of " + matches.length;
    });
    document.addEventListener("visibilitychange", function () {  // as the jobs page does
      if (ended) return;
      if (document.hidden && feed) { feed.close(); feed = null; unfed(); }
      else if (!document.hidden && !feed) open();
    });
  }

  // The width of one chart in a grid of columns at least 420 px wide (16 px apart).
  function chartWidth(grid) {
    var cols = Math.max(1, Math.floor((grid.clientWidth + 16) / 436));
    return Math.max(200, Math.floor((grid.clientWidth - 16 * (cols - 1)) / cols) - 4);
  }

  // Tick labels of a few characters: thousands and up as k, M, G, T (1.2M), tiny or huge
  // values in exponent form (3.9e-7), the others with the decimals their spacing needs.
  function tickTexts(u, splits) {
    var xs = splits.filter(function (v) { return typeof v === "number" && isFinite(v); });
    var big = Math.max.apply(null, xs.map(Math.abs).concat([0])), step = Infinity;
    for (var i = 1; i < xs.length; i++) step = Math.min(step, Math.abs(xs[i] - xs[i - 1]) || Infinity);
    if (!isFinite(step)) step = big || 1;
    return splits.map(function (v) { return tickText(v, big, step); });
  }
  function tickText(v, big, step) {
    if (typeof v !== "number" || !isFinite(v)) return "";
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (big >= 1e15 || big < 1e-3) {
      var digits = Math.max(0, Math.min(6, Math.floor(Math.log10(a)) - Math.floor(Math.log10(step))));
      return v.toExponential(digits).replace(/\.?0+e/, "e").replace("e+", "e");
    }
    if (big >= 1e4 && a >= 1000) {  // each label in its own unit: 800k, 1M, 1.2M
      var e = Math.min(4, Math.floor(Math.log10(a) / 3)), unit = Math.pow(1000, e);
      return decimals(v / unit, step / unit) + "kMGT"[e - 1];
    }
    return decimals(v, step);
  }
  function decimals(v, step) {  // as many decimals as the ticks' spacing has (0.25: two)
    var d = 0;
    while (d < 8 && Math.abs(step * Math.pow(10, d) - Math.round(step * Math.pow(10, d))) > 1e-6 * step * Math.pow(10, d)) d++;
    return String(+v.toFixed(d));
  }
  // An axis as wide as its widest label (uPlot's axis.size as a function, as its
  // axis-autosize demo does): a label is never clipped at the chart's left edge.
  function fitLabels(u, values, i, cycle) {
    var axis = u.axes[i], longest = "";
    if (cycle > 1) return axis._size;
    (values || []).forEach(function (v) { if (String(v).length > longest.length) longest = String(v); });
    var size = axis.ticks.size + axis.gap;
    if (longest) {
      u.ctx.font = axis.font[0];
      size += u.ctx.measureText(longest).width / (window.devicePixelRatio || 1);
    }
    return Math.ceil(size) + 2;
  }
  function axes() {
    var ink = getComputedStyle(document.body).color;
    return [{stroke: ink, values: tickTexts}, {stroke: ink, values: tickTexts, size: fitLabels}];
  }

  // A page's charts: x by step (never dates); drag across one to zoom in on x, double-click
  // to zoom out. With SYNC checked (or no SYNC) every chart zooms together. A zoom stays
  // through live refreshes and redraws until the user resets it. A zoom is a plain
  // {from, to} (null: the whole run), kept on each chart as u.zoom; g.zoom applies one
  // (the user's, or a link's), and then calls each of g.onzoom (the page's URL follows).
  function chartGroup(sync) {
    var g = {plots: {}, all: null, own: {}, onzoom: []};
    var together = function () { return !sync || sync.checked; };
    var zoomOf = function (name) { return together() ? g.all : g.own[name] || null; };
    var apply = function (u, z) {
      var x = u.data[0];
      u.zoom = z;
      if (z) u.setScale("x", {min: z.from, max: z.to});
      else if (x.length) u.setScale("x", {min: x[0], max: x[x.length - 1]});
    };
    var told = function (name, z) { g.onzoom.forEach(function (f) { f(name, z); }); };
    g.zoom = function (name, z) {  // the zoom on chart NAME; null: zoomed out
      if (together()) {
        g.all = z;
        Object.keys(g.plots).forEach(function (n) { apply(g.plots[n], z); });
      } else {
        if (z) g.own[name] = z; else delete g.own[name];
        if (g.plots[name]) apply(g.plots[name], z);
      }
      told(together() ? null : name, z);  // null: every chart
    };
    g.zoomOf = zoomOf;
    g.draw = function (name, opts, data, box) {  // a new chart, zoomed as the others are
      opts.scales = opts.scales || {};
      opts.scales.x = {time: false};
      opts.axes = axes();
      opts.cursor = Object.assign(opts.cursor || {}, {drag: {x: true, y: false, setScale: false}});
      opts.hooks = Object.assign(opts.hooks || {}, {
        setSelect: [function (u) {
          if (u.select.width <= 0) return;
          var at = function (px) { return +u.posToVal(px, "x").toPrecision(6); };  // a short URL
          var z = {from: at(u.select.left), to: at(u.select.left + u.select.width)};
          u.setSelect({left: 0, top: 0, width: 0, height: 0}, false);
          g.zoom(name, z);
        }],
        ready: [function (u) {
          u.over.addEventListener("dblclick", function () { g.zoom(name, null); });
        }]
      });
      var u = g.plots[name] = new uPlot(opts, data, box), z = zoomOf(name);
      u.zoom = null;
      if (z) apply(u, z);
      return u;
    };
    g.update = function (name, data) {  // new points for a drawn chart: its zoom kept
      var u = g.plots[name], z = zoomOf(name);
      u.batch(function () { u.setData(data); if (z) apply(u, z); });
    };
    g.destroy = function () {
      Object.keys(g.plots).forEach(function (n) { g.plots[n].destroy(); delete g.plots[n]; });
    };
    g.forget = function () {  // a new x axis: the zooms mean nothing there
      g.all = null; g.own = {};
      told(null, null);
    };
    // The zooms as a link holds them: "from,to" for all charts, "NAME,from,to" for one.
    g.saved = function () {
      if (together()) return g.all ? [g.all.from + "," + g.all.to] : [];
      return Object.keys(g.own).map(function (n) { return n + "," + g.own[n].from + "," + g.own[n].to; });
    };
    g.restore = function (entries) {  // before the charts are drawn
      entries.forEach(function (e) {
        var parts = e.split(","), to = parseFloat(parts.pop()), from = parseFloat(parts.pop());
        if (!isFinite(from) || !isFinite(to) || from >= to) return;
        if (parts.length) g.own[parts.join(",")] = {from: from, to: to};
        else g.all = {from: from, to: to};
      });
    };
    if (sync) sync.addEventListener("change", function () {
      if (sync.checked) { g.forget(); g.zoom(null, null); }  // together again: all zoomed out
      else {
        Object.keys(g.plots).forEach(function (n) { if (g.all) g.own[n] = g.all; });
        told(null, null);
      }
    });
    return g;
  }

  // -- job page: one chart per metric (uPlot), each series fetched once, cut down by the
  // server to the chart's pixels (each pixel's lowest and highest point); a zoom fetches
  // its window again, finer; a running job's charts get only the points logged since the
  // last (the "since" cursor). Log y and smoothing (an exponential moving average) on top.
  var charts = document.getElementById("charts"), raw = {}, drawnAs = "", cursor = null;
  var group = chartGroup(document.getElementById("syncx")), plots = group.plots;
  var xBy = document.getElementById("xby"), overlayRuns = document.getElementById("overlay-runs");
  var others = [];  // [{job, series}] of the sweep's other runs, when overlaid
  var colours = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00"];
  var logY = document.getElementById("logy"), smooth = document.getElementById("smooth");
  if (charts) window.monkeyCharts = plots;  // for tests and the curious
  function shown(ys) {
    var w = smooth ? parseFloat(smooth.value) : 0, avg = null;
    return ys.map(function (y) {
      if (y === null || (logY && logY.checked && y <= 0)) return null;
      avg = avg === null || !w ? y : w * avg + (1 - w) * y;
      return avg;
    });
  }
  // A series' points as drawn: the whole one's, and inside a zoomed window its finer ones
  function points(s) {
    var w = s.win;
    if (!w) return [s.x, s.y];
    var x = [], y = [], i = 0;
    for (; i < s.x.length && s.x[i] < w.lo; i++) { x.push(s.x[i]); y.push(s.y[i]); }
    for (var k = 0; k < w.x.length; k++) { x.push(w.x[k]); y.push(w.y[k]); }
    while (i < s.x.length && s.x[i] <= w.hi) i++;
    for (; i < s.x.length; i++) { x.push(s.x[i]); y.push(s.y[i]); }
    return [x, y];
  }
  function caption(s) {
    var n = s.win ? s.win.x.length : s.x.length;
    return s.points + " points, by " + s.by + (s.points > n ? " (" + n + (s.win ? " in this window" : "") + " shown: lowest and highest of each pixel)" : "");
  }
  function render() {
    var width = chartWidth(charts), mode = (logY && logY.checked ? "log" : "lin") + width + (xBy ? xBy.value : "") + others.length;
    var names = Object.keys(raw);
    if (!names.length) return;
    if (mode !== drawnAs) {  // a new scale or width: drawn again
      charts.innerHTML = "";
      group.destroy();
      drawnAs = mode;
    }
    names.forEach(function (name, i) {
      var s = raw[name], mine = points(s), data = [mine[0], shown(mine[1])], lines = [{label: name, stroke: colours[i % colours.length], width: 1.5, spanGaps: true}];
      var more = others.filter(function (o) { return o.series[name]; });
      if (more.length) {  // this run first and thick, the others thin, in the other colours
        data = uPlot.join([mine].concat(more.map(function (o) { return [o.series[name].x, o.series[name].y]; })));
        data = [data[0]].concat(data.slice(1).map(shown));
        lines[0].width = 2.5;
        more.forEach(function (o, k) {
          lines.push({label: o.job, stroke: colours[(i + k + 1) % colours.length], width: 1, spanGaps: true});
        });
      }
      if (plots[name]) {
        group.update(name, data);
        plots[name].root.parentNode.querySelector("figcaption").textContent = caption(s);
        return;
      }
      var box = document.createElement("figure");
      box.className = "chart";
      var title = document.createElement("h3");
      title.textContent = name;
      var note = document.createElement("figcaption");
      note.className = "note";
      note.textContent = caption(s);
      box.appendChild(title);
      charts.appendChild(box);
      group.draw(name, {
        width: width, height: 220,
        scales: {y: logY && logY.checked ? {distr: 3} : {}},
        series: [{label: s.by === "time" ? "seconds" : s.by}].concat(lines)
      }, data, box);
      box.appendChild(note);
    });
  }
  function query(more) {
    return "?width=" + Math.round(chartWidth(charts)) + "&x=" + (xBy ? xBy.value : "step") + (more || "");
  }
  function getJSON(src) {
    return fetch(src, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : {}; });
  }
  function lastOf(all) {  // the rowid of the last point the page has: the next "since"
    Object.keys(all).forEach(function (n) { cursor = Math.max(cursor || 0, all[n].last); });
  }
  var loading = null, asked = 0;
  function drawCharts() {  // every series whole (and its zoomed window again)
    if (!charts || !window.uPlot) return;
    var runs = overlayRuns && overlayRuns.checked ? overlayRuns.dataset.runs.split(",") : [];
    var mine = ++asked;
    loading = Promise.all([getJSON(charts.dataset.src + query())].concat(runs.map(function (j) {
      return getJSON("/web/jobs/" + encodeURIComponent(j) + "/metrics" + query());
    }))).then(function (all) {
      if (mine !== asked) return;
      var was = raw;
      raw = all[0];
      Object.keys(raw).forEach(function (n) {  // a window of the same axis stays
        if (was[n] && was[n].win && was[n].by === raw[n].by) raw[n].win = was[n].win;
      });
      cursor = 0;  // no point yet: the next refresh asks for all there are
      lastOf(raw);
      others = all.slice(1).map(function (series, k) { return {job: runs[k], series: series}; });
      render();
      zoomedWindows();
    }).finally(function () { if (mine === asked) loading = null; });
    return loading;
  }
  // A zoom (a drag across a chart, or one a link restored; NAME null: every chart) fetches
  // its window finer; a zoom out goes back to the whole series.
  var asking = {};  // NAME ("" for every chart) -> its latest window asked
  function fetchWindow(name, z) {
    var key = name === null ? "" : name, mine = asking[key] = (asking[key] || 0) + 1;
    var only = name === null ? "" : "&name=" + encodeURIComponent(name);
    getJSON(charts.dataset.src + query("&from=" + z.from + "&to=" + z.to + only)).then(function (got) {
      if (mine !== asking[key]) return;  // zoomed again meanwhile
      Object.keys(got).forEach(function (n) {
        var s = raw[n];
        if (s && s.by === got[n].by) s.win = {lo: z.from, hi: z.to, x: got[n].x, y: got[n].y};
      });
      render();
    });
  }
  function zoomedWindows() {  // the zooms drawn without their finer window yet
    if (group.all) {
      if (Object.keys(raw).some(function (n) { return !raw[n].win; })) fetchWindow(null, group.all);
      return;
    }
    Object.keys(group.own).forEach(function (n) {
      if (raw[n] && !raw[n].win) fetchWindow(n, group.own[n]);
    });
  }
  group.onzoom.push(function (name, z) {
    if (z) return fetchWindow(name, z);
    (name === null ? Object.keys(raw) : [name]).forEach(function (n) { if (raw[n]) delete raw[n].win; });
    asking = {};
    render();
  });
  // A running job's new points, appended: its charts' zoom kept
  function refresh() {
    if (loading || cursor === null) return;  // the whole is on its way (or not asked yet)
    var z = group.all, at = z ? "&from=" + z.from + "&to=" + z.to : "";  // the scale drawn
    var src = charts.dataset.src + query("&since=" + cursor + at), mine = asked;
    return getJSON(src).then(function (got) {
      if (mine !== asked) return;  // drawn whole again meanwhile
      var names = Object.keys(got);
      if (names.some(function (n) { return raw[n] && raw[n].by !== got[n].by; })) return drawCharts();
      names.forEach(function (n) {
        var s = raw[n], g = got[n];
        if (!s) { raw[n] = g; return; }  // a new series: all its points are new
        s.x = s.x.concat(g.x); s.y = s.y.concat(g.y); s.points = g.points; s.last = g.last;
        if (s.win) g.x.forEach(function (x, k) {
          if (x >= s.win.lo && x <= s.win.hi) { s.win.x.push(x); s.win.y.push(g.y[k]); }
        });
      });
      lastOf(got);
      if (names.length) render();
    });
  }
  if (xBy) xBy.addEventListener("change", function () { raw = {}; group.forget(); drawCharts(); });
  if (overlayRuns) overlayRuns.addEventListener("change", drawCharts);
  if (logY) logY.addEventListener("change", render);
  if (smooth) smooth.addEventListener("input", render);
  // Its view in the URL and remembered (view.js): log y, smoothing, x, the overlay, zooming
  // together (for every job page), the zoom (this job's)
  if (charts && window.monkeyView) {
    var view = monkeyView("job", {logy: "kind", smooth: "kind", x: "kind", overlay: "kind", sync: "kind", zoom: "page"});
    var syncx = document.getElementById("syncx"), flag = function (box) { return box.checked ? "1" : null; };
    if (logY) logY.checked = view.get("logy") === "1";
    if (smooth) smooth.value = view.get("smooth") || "0";
    if (xBy) xBy.value = [].some.call(xBy.options, function (o) { return o.value === view.get("x"); }) ? view.get("x") : "step";
    if (overlayRuns) overlayRuns.checked = view.get("overlay") === "1";
    if (syncx) syncx.checked = view.get("sync") !== "0";
    group.restore(view.all("zoom"));
    group.onzoom.push(function () { view.set("zoom", group.saved()); });
    if (logY) logY.addEventListener("change", function () { view.set("logy", flag(logY)); });
    if (smooth) smooth.addEventListener("change", function () { view.set("smooth", +smooth.value ? smooth.value : null); });
    if (xBy) xBy.addEventListener("change", function () { view.set("x", xBy.value === "step" ? null : xBy.value); });
    if (overlayRuns) overlayRuns.addEventListener("change", function () { view.set("overlay", flag(overlayRuns)); });
    if (syncx) syncx.addEventListener("change", function () { view.set("sync", syncx.checked ? null : "0"); });
  }
  // the compare and sweep pages' curves (curves.js) zoom and tick as these charts do
  window.monkeyChartGroup = chartGroup;
  window.monkeyChartWidth = chartWidth;

  if (charts) {
    window.addEventListener("load", drawCharts);
    if (charts.dataset.live === "1") {
      setInterval(function () { if (!document.hidden) refresh(); }, 10000);
    }
  }
})();
