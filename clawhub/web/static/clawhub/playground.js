// The playground: asks this site for a short-lived key (kept in this closure, never in storage), then sends the
// same prompt to /v1 twice, for the base model and for the chosen adapter version, and shows both replies.
// A reply can be rated through /v1/feedback with the same key, which makes it a training sample.
(function () {
  "use strict";

  var form = document.getElementById("playground");
  if (!form) return;
  var status = document.getElementById("pg-status");
  var keys = {};  // group slug ("" personal) -> the promise of its secret, for as long as the page is open

  function csrf() {
    return form.querySelector("input[name=csrfmiddlewaretoken]").value;
  }

  function mintKey(group) {
    var body = new FormData();
    body.append("group", group);
    return fetch(form.dataset.keyUrl, {
      method: "POST", credentials: "same-origin", body: body, headers: {"X-CSRFToken": csrf()}
    }).then(function (response) {
      if (!response.ok) throw new Error("could not get a playground key (HTTP " + response.status + ")");
      return response.json();
    }).then(function (data) { return data.key; });
  }

  // The group's key; ``stale``: the one that was just refused, replaced unless another request already did.
  // Requests sent together share one mint (each mint ends the one before).
  function keyFor(group, stale) {
    if (!keys[group] || keys[group] === stale) {
      var minted = keys[group] = mintKey(group);
      minted.catch(function () { if (keys[group] === minted) delete keys[group]; });
    }
    return keys[group];
  }

  // One call to /v1 with the group's key; a key that ended (an hour passed, or another tab took over) is
  // replaced once.
  function v1(path, group, payload, headers, stale) {
    var used = keyFor(group, stale);
    return used.then(function (secret) {
      var all = {"Content-Type": "application/json", "Authorization": "Bearer " + secret};
      Object.keys(headers || {}).forEach(function (name) { all[name] = headers[name]; });
      return fetch(path, {method: "POST", credentials: "omit", headers: all, body: JSON.stringify(payload)});
    }).then(function (response) {
      if (response.status === 401 && !stale) return v1(path, group, payload, headers, used);
      return response.json().catch(function () { return {}; }).then(function (body) {
        if (!response.ok) {
          var error = new Error((body.error && body.error.message) || ("HTTP " + response.status));
          error.status = response.status;
          throw error;
        }
        return body;
      });
    });
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function rateButtons(group, completionId) {
    var box = el("p", "rate-inline");
    [["up", "Good (thumbs up)", "▲ Good"], ["down", "Bad (thumbs down)", "▼ Bad"]].forEach(function (b) {
      var button = el("button", "secondary", b[2]);
      button.type = "button";
      button.setAttribute("aria-label", b[1]);
      button.addEventListener("click", function () {
        box.querySelectorAll("button").forEach(function (x) { x.disabled = true; });
        var said = box.querySelector(".rated") || box.appendChild(el("span", "rated muted"));
        said.textContent = " Saving…";
        // The turn is stored a moment after its reply: a first "no such completion" is retried.
        var tries = 0;
        (function send() {
          v1("/v1/feedback", group, {completion_id: completionId, thumb: b[0]}).then(function () {
            said.textContent = " Rated " + (b[0] === "up" ? "good" : "bad") + ": this reply is now a training sample.";
          }).catch(function (error) {
            if (error.status === 404 && ++tries < 10) { setTimeout(send, 500); return; }
            said.textContent = " Not rated: " + error.message + " (rate it in Conversations).";
            box.querySelectorAll("button").forEach(function (x) { x.disabled = false; });
          });
        })();
      });
      box.appendChild(button);
    });
    return box;
  }

  function show(section, group, model, started, promise) {
    var reply = section.querySelector(".reply");
    section.querySelector(".model-name").textContent = model;
    reply.className = "reply muted";
    reply.textContent = "Waiting for the model…";
    return promise.then(function (body) {
      var seconds = ((performance.now() - started) / 1000).toFixed(1);
      var choice = (body.choices || [])[0] || {};
      var text = ((choice.message || {}).content || "").trim();
      var usage = body.usage || {};
      reply.className = "reply";
      reply.textContent = "";
      reply.appendChild(el("blockquote", "reply-text", text || "(an empty reply)"));
      var facts = seconds + " s · " + (usage.completion_tokens || 0) + " tokens";
      if (choice.finish_reason === "length") facts += " · stopped at max tokens";
      reply.appendChild(el("p", "muted facts", facts));
      reply.appendChild(rateButtons(group, body.id));
    }).catch(function (error) {
      reply.className = "reply failed";
      reply.textContent = "No reply: " + error.message;
    });
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var option = form.model.options[form.model.selectedIndex];
    var group = option.dataset.group || "";
    var messages = [];
    if (form.system.value.trim()) messages.push({role: "system", content: form.system.value});
    messages.push({role: "user", content: form.prompt.value});
    var session = "playground-" + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
    var headers = {"X-Session-Id": session, "X-Session-Done": "true"};
    function ask(model) {
      return v1(form.dataset.endpoint, group, {
        model: model, messages: messages, stream: false,
        max_tokens: Number(form.max_tokens.value) || 256, temperature: Number(form.temperature.value)
      }, headers);
    }
    var button = document.getElementById("pg-send");
    button.disabled = true;
    status.textContent = "Asking both…";
    var started = performance.now();
    // The key first, once, so that the two requests do not each mint one.
    keyFor(group).then(function () {
      return Promise.all([
        show(document.getElementById("answer-base"), group, form.dataset.base, started, ask(form.dataset.base)),
        show(document.getElementById("answer-adapter"), group, option.value, started, ask(option.value))
      ]);
    }).then(function () {
      status.textContent = "";
    }).catch(function (error) {
      status.textContent = error.message;
    }).finally(function () {
      button.disabled = false;
    });
  });
})();
