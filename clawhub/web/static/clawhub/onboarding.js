// The onboarding page's few behaviours, without a framework or a CDN (its copy buttons: copy.js): the test
// request, and a checklist that refreshes itself (it asks the server for its HTML every few seconds until every
// step is done).
(function () {
  "use strict";

  var test = document.getElementById("test-request");
  if (test) {
    test.addEventListener("click", function () {
      var out = document.getElementById("test-answer");
      var secret = document.getElementById(test.dataset.secretFrom).textContent.trim();
      out.hidden = false;
      out.className = "test-answer pending";
      out.textContent = "Waiting for the model…";
      test.disabled = true;
      var started = performance.now();
      fetch(test.dataset.endpoint, {
        method: "POST",
        credentials: "omit",  // the key authenticates, not the session
        headers: {"Content-Type": "application/json", "Authorization": "Bearer " + secret,
                  "X-Turn-Type": "side", "X-Session-Done": "true"},
        body: JSON.stringify({model: test.dataset.model, max_tokens: 48,
                              messages: [{role: "user", content: test.dataset.prompt}]})
      }).then(function (response) {
        return response.json().catch(function () { return {}; }).then(function (body) {
          var seconds = ((performance.now() - started) / 1000).toFixed(1);
          if (!response.ok) {
            var message = (body.error && body.error.message) || ("HTTP " + response.status);
            throw new Error(message);
          }
          var choice = (body.choices || [])[0] || {};
          var text = ((choice.message || {}).content || "").trim();
          out.className = "test-answer ok";
          out.textContent = "";
          var head = document.createElement("strong");
          head.textContent = body.model + " answered in " + seconds + " s:";
          var answer = document.createElement("blockquote");
          answer.id = "test-answer-text";
          answer.textContent = text || "(an empty reply)";
          out.appendChild(head);
          out.appendChild(answer);
        });
      }).catch(function (error) {
        out.className = "test-answer failed";
        out.textContent = "The test request failed: " + error.message;
      }).finally(function () {
        test.disabled = false;
        refresh();
      });
    });
  }

  // Polls every few seconds, backing off (up to ten times slower) while nothing changes and pausing while
  // the tab is hidden, so a page left open costs little; any change or the test request resets the pace.
  var box = document.getElementById("checklist");
  var timer = null;
  var base = 1000 * Number((box && box.dataset.pollSeconds) || 3);
  var delay = base;
  var last = null;  // the last HTML fetched (the browser re-serialises innerHTML, so compare with this)
  function allDone() {
    var list = box.querySelector(".checklist");
    return list && list.dataset.complete === "true";
  }
  function refresh() {
    if (!box) return Promise.resolve();
    return fetch(box.dataset.pollUrl, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null) return;
        if (html !== last) {
          if (last !== null) delay = base;
          last = html;
          box.innerHTML = html;
        } else {
          delay = Math.min(delay * 2, base * 10);
        }
      })
      .catch(function () { /* offline for a moment: the next poll tries again */ });
  }
  function poll() {
    clearTimeout(timer);
    if (allDone() || document.hidden) return;
    timer = setTimeout(function () { refresh().then(poll); }, delay);
  }
  if (box) {
    poll();
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden) { delay = base; refresh().then(poll); }
    });
    if (test) test.addEventListener("click", function () { delay = base; });
  }
})();
