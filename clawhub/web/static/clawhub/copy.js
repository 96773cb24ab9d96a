// Copy buttons beside a new key's secret, its OpenClaw config and its commands (the onboarding page and the
// key pages' secret page), without a framework or a CDN. Without JavaScript the text is still there to select.
(function () {
  "use strict";

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    // Plain http (not localhost): the Clipboard API is off, the old selection route still works.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = document.execCommand("copy");
    document.body.removeChild(area);
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function addCopyButton(target, label) {
    var button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy " + label);
    button.dataset.copyTarget = target.id;
    button.addEventListener("click", function () {
      copyText(target.textContent.trim()).then(function () {
        button.textContent = "Copied";
      }, function () {
        button.textContent = "Select and copy by hand";
      });
      setTimeout(function () { button.textContent = "Copy"; }, 2500);
    });
    if (target.tagName === "PRE") {
      // Over the block's top-right corner, so the block keeps its full width.
      var wrap = document.createElement("div");
      wrap.className = "copy-wrap";
      target.parentNode.insertBefore(wrap, target);
      wrap.appendChild(button);
      wrap.appendChild(target);
    } else {
      target.parentNode.insertBefore(button, target);
    }
  }

  var copyable = {"key-secret": "the key", "openclaw-config": "the OpenClaw config",
                  "openclaw-onboard": "the onboard commands"};
  Object.keys(copyable).forEach(function (id) {
    var el = document.getElementById(id);
    if (el) addCopyButton(el, copyable[id]);
  });
})();
