// fleet-budget console: live refresh of the overview and of a replay's progress.
// Vendored, no build step, no dependency. It renders nothing itself: the overview's parts come
// rendered (and escaped) by the server and are swapped in whole, through DOMParser (which runs
// no script); a replay's figures are written as text (textContent).
"use strict";

(function () {
  function poll(url, every, apply, accept) {
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": accept || "application/json" } })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return accept ? r.text() : r.json(); })
        .then(function (data) { if (apply(data) !== false) { setTimeout(tick, every); } })
        .catch(function (e) {
          var note = document.getElementById("refreshed");
          if (note) { note.textContent = "refresh failed (" + e.message + "), retrying"; }
          setTimeout(tick, every * 2);
        });
    }
    setTimeout(tick, every);
  }

  // The overview's rows, pager and workers' line come rendered by the server (escaped there,
  // as on the page); each part replaces the element of the same id. Nothing is rendered here.
  function overview(table) {
    poll(table.getAttribute("data-source"), 2000, function (html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      ["overview-rows", "overview-pager", "workers-line", "reading-age"].forEach(function (id) {
        var fresh = doc.getElementById(id);
        var old = document.getElementById(id);
        if (fresh && old) { old.parentNode.replaceChild(document.importNode(fresh, true), old); }
      });
      var note = document.getElementById("refreshed");
      if (note) { note.textContent = "This page refreshes every 2 s (last at " + new Date().toLocaleTimeString() + ")."; }
    }, "text/html");
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
