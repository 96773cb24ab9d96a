// Live training progress: polls each .run-live section's data-url (JSON from training.views.run_progress_json)
// and updates its fields, bar and phase row in place, until the run can no longer change. No library.
(function () {
  "use strict";
  function fmt(name, value) {
    if (value === null || value === undefined) return "—";
    if (name === "loss") return Number(value).toFixed(4);
    if (name === "mean_reward") return Number(value).toFixed(2);
    return String(value);
  }
  function apply(section, data) {
    section.querySelectorAll("[data-field]").forEach(function (el) {
      var name = el.getAttribute("data-field");
      if (!(name in data)) return;
      if (name === "percent") {
        el.value = data.percent || 0;
        el.textContent = (data.percent || 0) + " %";
      } else {
        el.textContent = fmt(name, data[name]);
      }
      if (name === "state") el.className = "state state-" + data.state;
    });
    section.querySelectorAll("[data-phase]").forEach(function (li) {
      li.classList.toggle("current", li.getAttribute("data-phase") === data.phase);
    });
    // What only an open run offers (its Cancel button) goes once the run has finished.
    document.querySelectorAll('[data-while-open="' + data.run + '"]').forEach(function (el) {
      el.hidden = !data.open;
    });
    section.setAttribute("data-phase", data.phase);
    section.setAttribute("data-done", data.done ? "true" : "false");
  }
  function poll(section) {
    var every = parseFloat(section.getAttribute("data-poll-seconds") || "2") * 1000;
    function tick() {
      fetch(section.getAttribute("data-url"), {credentials: "same-origin", headers: {Accept: "application/json"}})
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (data) {
          apply(section, data);
          if (!data.done) setTimeout(tick, every);
        })
        .catch(function () { setTimeout(tick, every * 3); });  // a hiccup: try again, less often
    }
    if (section.getAttribute("data-done") !== "true") setTimeout(tick, every);
  }
  document.querySelectorAll(".run-live[data-url]").forEach(poll);
})();
