/* The chat widget on a page of any site, from one script tag (docs/widget.md):
 *
 *   <script src="https://chat.example.com/static/conversations/embed.js"
 *           data-api="https://chat.example.com/api/" data-assistant="support" defer></script>
 *
 * It asks the API for a visitor token for this page's origin (the browser sends the Origin; the
 * API answers only the origins the site allows), then puts a <conversations-widget> element after
 * the tag (or in the element `data-target` selects) with what the API answered — its URLs, the
 * strings in the visitor's language, the assistant's greeting — and loads widget.js, which sends
 * the token instead of cookies. The visitor id the token names is random, made here once and
 * kept in this site's localStorage, so that the visitor keeps their conversations across pages
 * and reloads. Other attributes: data-mode ("inline" or "launcher"), data-key (see widget.md),
 * data-identity (a signed-in user's signed identity, written into the page by the site's server).
 * A page the API refuses (an origin not allowed, a sign-in needed) gets the API's sentence. */
(function () {
  "use strict";
  var COULD_NOT_LOAD = "The assistant could not load.";
  var current = document.currentScript; // null once this script has run

  /* 24 random bytes, URL-safe: the visitor's id on this site (as the API's VISITOR_ID wants it). */
  function randomId() {
    var bytes = new Uint8Array(24);
    crypto.getRandomValues(bytes);
    return btoa(String.fromCharCode.apply(null, bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function visitorId(api) {
    var key = "cvw-visitor:" + api, id = null;
    try { id = localStorage.getItem(key); } catch (e) { /* storage off: a new visitor on each page */ }
    if (!id || !/^[A-Za-z0-9_-]{22,64}$/.test(id)) {
      id = randomId();
      try { localStorage.setItem(key, id); } catch (e) { /* as above */ }
    }
    return id;
  }

  /* Where the widget goes: the element `data-target` names, else just after the script tag (in
   * the body when the tag is in the head). */
  function place(script, node) {
    var target = script.dataset.target && document.querySelector(script.dataset.target);
    if (target) { target.appendChild(node); }
    else if (script.parentNode && script.parentNode !== document.head) { script.parentNode.insertBefore(node, script.nextSibling); }
    else { document.body.appendChild(node); }
  }

  function refuse(script, sentence) {
    var p = document.createElement("p");
    p.className = "conversations-refused";
    p.setAttribute("role", "status");
    p.textContent = sentence; // the API's sentence, as text
    place(script, p);
  }

  function loadWidget(url) {
    if (window.ConversationsWidget) { window.ConversationsWidget.start(); return; }
    if (document.querySelector("script[data-conversations-widget-script]")) { return; } // on its way
    var tag = document.createElement("script");
    tag.src = url;
    tag.setAttribute("data-conversations-widget-script", "");
    document.head.appendChild(tag);
  }

  function embed(script) {
    var data = script.dataset;
    var api = new URL((data.api || "/api/").replace(/\/?$/, "/"), script.src).href;
    var visitor = visitorId(api), body = { assistant: data.assistant || "", visitor: visitor };
    if (data.identity) { body.identity = data.identity; }
    fetch(api + "widget-token/", { method: "POST", credentials: "omit", body: JSON.stringify(body),
                                   headers: { "Accept": "application/json", "Content-Type": "application/json" } })
      .catch(function () { throw new Error(COULD_NOT_LOAD); }) // unreachable: no sentence of the browser's
      .then(function (response) {
        return response.json().catch(function () { return {}; }).then(function (answer) {
          if (!response.ok) { throw new Error(typeof answer.detail === "string" ? answer.detail : COULD_NOT_LOAD); }
          return answer;
        });
      })
      .then(function (answer) {
        var w = answer.widget, host = document.createElement("conversations-widget");
        var attributes = {
          "api-url": w.api_url, "token-url": w.token_url, "token": answer.token, "token-expires": answer.expires_in,
          "visitor": visitor, "identified": data.identity ? "true" : "false", "css-url": w.css_url,
          "mode": data.mode || "inline", "assistant": data.assistant || "",
          // As the tag does: one conversation per assistant, wherever its widget stands.
          "key": data.key || (data.assistant ? "assistant-" + data.assistant : ""),
          "greeting": w.greeting, "suggestions": JSON.stringify(w.suggestions), "strings": JSON.stringify(w.strings),
          "job-timeout": w.job_timeout, "max-length": w.max_length, "give-up-margin": w.give_up_margin,
          "comment-max-length": w.comment_max_length, "handoff": w.handoff || ""
        };
        Object.keys(attributes).forEach(function (name) {
          if (attributes[name] !== "") { host.setAttribute("data-" + name, attributes[name]); }
        });
        host.setAttribute("data-conversations-widget", "");
        place(script, host);
        loadWidget(w.script_url);
      })
      .catch(function (error) { refuse(script, error && error.message || COULD_NOT_LOAD); });
  }

  function start() {
    var scripts = current ? [current] : [];
    // Each tag of the page that loads this file (it runs once, for every one of them).
    Array.prototype.forEach.call(document.querySelectorAll("script[src*='conversations/embed']"), function (s) {
      if (scripts.indexOf(s) < 0) { scripts.push(s); }
    });
    scripts.forEach(function (script) {
      if (script.hasAttribute("data-conversations-started")) { return; }
      script.setAttribute("data-conversations-started", "");
      embed(script);
    });
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
