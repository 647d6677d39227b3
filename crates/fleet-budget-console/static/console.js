// fleet-budget console: live refresh of the overview and of a replay's progress.
// Vendored, no build step, no dependency. It writes text only (textContent), never HTML:
// every string it shows comes escaped from the server's JSON and stays text.
"use strict";

(function () {
  function text(tag, value, cls) {
    var el = document.createElement(tag);
    el.textContent = value;
    if (cls) { el.className = cls; }
    return el;
  }

  function num(v, digits) {
    return v === null || v === undefined ? "-" : Number(v).toFixed(digits);
  }

  function breaker(b) {
    if (!b) { return "-"; }
    if (b.state === "open") { return "open, half-opens in " + num(b.half_opens_in_secs, 0) + "s"; }
    if (b.state === "half_open") { return "half-open, " + b.probe_successes + " of " + b.probes_issued + " probes ok"; }
    return "closed (" + num(b.failures, 0) + "/" + num(b.calls, 0) + " failed)";
  }

  function overrides(r) {
    var parts = [];
    if (r.frozen) { parts.push("FROZEN by " + r.frozen.actor + " (" + r.frozen.reason + "), " + num(r.frozen.expires_in_secs, 0) + "s left"); }
    if (r.set) { parts.push(r.set.what + " by " + r.set.actor + " (" + r.set.reason + "), " + num(r.set.expires_in_secs, 0) + "s left"); }
    return parts.join("; ");
  }

  function overviewRow(r) {
    var tr = document.createElement("tr");
    tr.setAttribute("data-severity", String(r.severity));
    var td = document.createElement("td");
    var a = text("a", r.dependency);
    a.href = "/dependency/" + encodeURIComponent(r.dependency);
    td.appendChild(a);
    tr.appendChild(td);
    tr.appendChild(text("td", String(r.allowance), "num"));
    tr.appendChild(text("td", String(r.spent), "num"));
    tr.appendChild(text("td", String(r.remaining), "num"));
    tr.appendChild(text("td", num(r.denials_per_sec, 2), "num"));
    tr.appendChild(text("td", r.amplification === null ? "-" : num(r.amplification, 2) + "x", "num"));
    tr.appendChild(text("td", breaker(r.breaker)));
    tr.appendChild(text("td", r.concurrency ? r.concurrency.in_flight + "/" + r.concurrency.cap : "-", "num"));
    tr.appendChild(text("td", r.workers_in_fallback === null ? "-" : String(r.workers_in_fallback), "num fallback"));
    tr.appendChild(text("td", overrides(r)));
    tr.appendChild(text("td", r.alert, "alert"));
    return tr;
  }

  // The same sentence as pages/overview.rs `workers_line`.
  function workersLine(data) {
    var w = data.workers;
    if (!w) {
      return data.workers_error ? "Worker registry unreadable: " + data.workers_error + "." : "Worker registry not read.";
    }
    var line = w.reporting + " workers reporting, " + w.in_fallback + " in fallback, " + w.silent +
      " silent: a silent worker may be cut off from Redis and deciding from its fallback, or stopped.";
    if (w.unreadable > 0) { line += " " + w.unreadable + " registry entries unreadable."; }
    if (w.truncated) { line += " Counted over the 10000 seen last of " + w.total + " entries."; }
    return line;
  }

  function poll(url, every, apply) {
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
        .then(function (data) { if (apply(data) !== false) { setTimeout(tick, every); } })
        .catch(function (e) {
          var note = document.getElementById("refreshed");
          if (note) { note.textContent = "refresh failed (" + e.message + "), retrying"; }
          setTimeout(tick, every * 2);
        });
    }
    setTimeout(tick, every);
  }

  function overview(table) {
    poll(table.getAttribute("data-source"), 2000, function (data) {
      var body = document.createElement("tbody");
      data.dependencies.forEach(function (r) { body.appendChild(overviewRow(r)); });
      table.replaceChild(body, table.tBodies[0]);
      var workers = document.getElementById("workers-line");
      if (workers) { workers.textContent = workersLine(data); }
      var note = document.getElementById("refreshed");
      if (note) { note.textContent = "last read " + new Date().toLocaleTimeString(); }
    });
  }

  function progress(table) {
    poll(table.getAttribute("data-source"), 1000, function (j) {
      var set = function (id, v) { var el = document.getElementById(id); if (el) { el.textContent = v; } };
      set("j-seen", j.seen + " of " + j.total);
      set("j-moved", String(j.moved));
      set("j-parked", String(j.parked));
      set("j-skipped", String(j.skipped));
      set("j-failed", String(j.failed));
      set("j-removed", String(j.removed));
      set("j-elapsed", j.elapsed_secs.toFixed(1) + " s");
      set("j-state", j.state);
      set("j-held", j.held_text);
      set("j-rate", j.rate_text);
      set("j-slowdowns", String(j.slowdowns));
      set("j-cancelled-by", j.cancel_requested_by === null ? "-" : j.cancel_requested_by);
      set("j-error", j.error === null ? "-" : j.error);
      if (j.done) {
        var cancel = document.getElementById("cancel-replay");
        if (cancel) { cancel.parentNode.removeChild(cancel); }
      }
      return !j.done;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("overview");
    if (table) { overview(table); }
    var job = document.getElementById("progress");
    if (job) { progress(job); }
  });
})();
