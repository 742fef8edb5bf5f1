/* The conversations chat widget: plain JavaScript, no build step.
 * Posts the visitor's message, then polls the turn's state until `done`, drawing each step
 * as it lands. Model and tool text is only ever set with textContent: never parsed as HTML. */
(function () {
  "use strict";

  function csrfToken() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function Widget(root) {
    this.root = root;
    this.apiUrl = root.dataset.apiUrl;
    this.jobTimeout = Number(root.dataset.jobTimeout || 120);
    this.log = root.querySelector(".cvw-log");
    this.status = root.querySelector(".cvw-status");
    this.form = root.querySelector(".cvw-form");
    this.input = root.querySelector(".cvw-input");
    this.send = root.querySelector(".cvw-send");
    this.stop = root.querySelector(".cvw-stop");
    this.storageKey = "conversations:" + this.apiUrl;
    this.conversationId = sessionStorage.getItem(this.storageKey);
    this.turn = null;
    this.shown = {};
    this.bind();
    this.restore();
  }

  Widget.prototype.bind = function () {
    var self = this;
    this.form.addEventListener("submit", function (event) { event.preventDefault(); self.submit(); });
    this.input.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); self.submit(); }
    });
    this.stop.addEventListener("click", function () { self.cancel(); });
  };

  Widget.prototype.request = function (method, url, body) {
    var options = { method: method, credentials: "same-origin", headers: { "Accept": "application/json" } };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.headers["X-CSRFToken"] = csrfToken();
      options.body = JSON.stringify(body);
    }
    return fetch(url, options).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) {
          var message = data.detail || (data.content && data.content[0]) || ("HTTP " + response.status);
          throw new Error(message);
        }
        return data;
      });
    });
  };

  Widget.prototype.restore = function () {
    var self = this;
    if (!this.conversationId) { return; }
    this.request("GET", this.apiUrl + this.conversationId + "/").then(function (data) {
      data.messages.forEach(function (m) { self.draw(m); });
      if (data.active_turn) { self.follow(data.active_turn); }
    }).catch(function () {
      sessionStorage.removeItem(self.storageKey);
      self.conversationId = null;
    });
  };

  Widget.prototype.ensureConversation = function () {
    var self = this;
    if (this.conversationId) { return Promise.resolve(this.conversationId); }
    return this.request("POST", this.apiUrl, {}).then(function (data) {
      self.conversationId = data.id;
      sessionStorage.setItem(self.storageKey, data.id);
      return data.id;
    });
  };

  Widget.prototype.submit = function () {
    var self = this;
    var content = this.input.value.trim();
    if (!content || this.turn) { return; }
    this.busy(true);
    this.ensureConversation().then(function (id) {
      return self.request("POST", self.apiUrl + id + "/turns/", { content: content });
    }).then(function (turn) {
      self.input.value = "";
      self.follow(turn);
    }).catch(function (error) {
      self.busy(false);
      self.setStatus(error.message);
    });
  };

  Widget.prototype.follow = function (turn) {
    this.turn = { id: turn.id, pollUrl: turn.poll_url, cancelUrl: turn.cancel_url, etag: null, delay: 300,
                  giveUpAt: Date.now() + (this.jobTimeout + 30) * 1000 };
    this.busy(true);
    this.setStatus("The assistant is thinking…");
    this.poll();
  };

  Widget.prototype.poll = function () {
    var self = this;
    var turn = this.turn;
    if (!turn) { return; }
    if (Date.now() > turn.giveUpAt) {
      this.end({ status: "failed", error: "The assistant did not finish in time. Please try again." });
      return;
    }
    var headers = { "Accept": "application/json" };
    if (turn.etag) { headers["If-None-Match"] = turn.etag; }
    fetch(turn.pollUrl, { credentials: "same-origin", headers: headers }).then(function (response) {
      if (response.status === 304) { return null; }
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      turn.etag = response.headers.get("ETag");
      return response.json();
    }).then(function (state) {
      if (self.turn !== turn) { return; }
      if (state) {
        state.messages.forEach(function (m) { self.draw(m); });
        turn.delay = 300;
        if (state.done) { self.end(state); return; }
      } else {
        turn.delay = Math.min(turn.delay * 1.5, 3000);
      }
      setTimeout(function () { self.poll(); }, turn.delay);
    }).catch(function () {
      if (self.turn !== turn) { return; }
      self.setStatus("Reconnecting…");
      turn.delay = Math.min(turn.delay * 2, 5000);
      setTimeout(function () { self.poll(); }, turn.delay);
    });
  };

  Widget.prototype.end = function (state) {
    this.turn = null;
    this.busy(false);
    if (state.error) { this.draw({ id: "error-" + Date.now(), role: "error", content: state.error }); }
    else if (state.status === "cancelled") { this.draw({ id: "cancel-" + Date.now(), role: "error", content: "Stopped." }); }
    this.setStatus("");
    this.input.focus();
  };

  Widget.prototype.cancel = function () {
    if (!this.turn) { return; }
    this.setStatus("Stopping…");
    this.request("POST", this.turn.cancelUrl, {}).catch(function () {});
  };

  Widget.prototype.draw = function (message) {
    if (this.shown[message.id]) { return; }
    if (message.role === "assistant" && !message.content && !(message.tool_calls || []).length) { return; }
    this.shown[message.id] = true;
    var item = document.createElement("li");
    item.className = "cvw-msg cvw-msg-" + message.role;
    if (message.role === "assistant" && !message.content) {
      item.className = "cvw-msg cvw-msg-tool";
      item.textContent = "Using " + message.tool_calls.map(function (c) { return c.name; }).join(", ") + "…";
    } else if (message.role === "tool") {
      item.textContent = (message.name || "tool") + ": " + (message.content || "").slice(0, 300);
    } else {
      item.textContent = message.content;
    }
    this.log.appendChild(item);
    this.log.scrollTop = this.log.scrollHeight;
  };

  Widget.prototype.busy = function (busy) {
    this.send.disabled = busy;
    this.stop.hidden = !busy;
  };

  Widget.prototype.setStatus = function (text) { this.status.textContent = text; };

  function start() {
    document.querySelectorAll("[data-conversations-widget]").forEach(function (root) {
      if (!root.conversationsWidget) { root.conversationsWidget = new Widget(root); }
    });
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
