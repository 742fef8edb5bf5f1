/* The conversations chat widget: plain JavaScript, no build step.
 *
 * Embed: a <conversations-widget> element (or any element with `data-conversations-widget`),
 * options in data-* attributes (see docs/widget.md), plus this script. The widget draws itself
 * in the element's shadow root, with widget.css linked there, so the host page's styles and
 * the widget's leave each other alone. It posts the visitor's message, then polls the turn's
 * state with a setTimeout chain until `done`, drawing each step as it lands and a streamed
 * answer as it grows. Model and tool text is only ever put in the page with textContent and
 * createElement: it is never parsed as HTML. */
(function () {
  "use strict";
  if (window.ConversationsWidget) { window.ConversationsWidget.start(); return; } // the script twice on a page

  // The stylesheet beside this script, unless the element names one (data-css-url): the tag
  // does, since a hashed static file (ManifestStaticFilesStorage) has a name of its own.
  var script = document.currentScript;
  var CSS_URL = script && script.src ? script.src.replace(/\.js(?=[?#]|$)/, ".css") : "";

  // English defaults; the {% chat_widget %} tag passes every string translated.
  var STRINGS = {
    title: "Assistant",
    region: "Chat with the assistant",
    log: "Conversation",
    label: "Your message",
    hint: "Enter sends, Shift+Enter adds a line.",
    send: "Send",
    stop: "Stop",
    thinking: "The assistant is thinking…",
    waiting: "Waiting for the assistant to start…",
    writing: "The assistant is writing…",
    unavailable: "The assistant could not load.",
    using_tool: "Using %(name)s…",
    tool_result: "%(name)s: %(result)s",
    tool_failed: "%(name)s failed: %(result)s",
    stopping: "Stopping…",
    stopped: "You stopped this answer.",
    reconnecting: "Connection lost. Reconnecting…",
    resuming: "Reconnecting…",
    timed_out: "The assistant did not finish in time. Please try again.",
    failed: "Something went wrong and the assistant could not answer. Please try again.",
    incomplete: "This answer is incomplete.",
    send_failed: "Your message could not be sent. Check your connection and try again.",
    busy: "The assistant is still answering. Wait for it to finish or press Stop.",
    gone: "This conversation is no longer available. Send your message again to start a new one.",
    close: "Close",
    delete_conversation: "Delete this conversation",
    delete_confirm: "Delete this conversation and everything in it? This cannot be undone.",
    deleted: "The conversation was deleted.",
    retention: "",
    sign_in: "Sign in to chat with the assistant.",
    rate: "Rate this answer",
    rate_up: "Helpful",
    rate_down: "Not helpful",
    comment_label: "Anything to add? (optional)",
    comment_send: "Send feedback",
    rated: "Thanks for your feedback.",
    sources: "Sources",
    talk_to_person: "Talk to a person",
    handoff_waiting: "A person will reply here. You can keep writing: they will read it.",
    handoff_taken: "%(name)s joined the conversation.",
    handoff_returned: "You are talking to the assistant again.",
    handoff_closed: "This conversation was closed by our staff.",
    handoff_expired: "No one is free to answer right now. You can wait, or go back to the assistant.",
    back_to_assistant: "Back to the assistant",
    approval_needed: "The assistant asks for your approval before it does this:",
    approval_details: "Details",
    approve: "Approve",
    decline: "Decline",
    approval_staff: "Our staff must approve this before the assistant goes on.",
    approval_waiting: "Waiting for your approval…"
  };
  var FIRST_DELAY = 300;      // ms before the first poll, and again after every change
  var GROWTH = 1.5;           // back off while nothing changes …
  var MAX_DELAY = 3000;       // … up to this
  var MAX_RETRY_DELAY = 8000; // network errors back off up to this
  var REQUEST_TIMEOUT = 15000;
  var RESULT_CHARS = 160;     // a tool result is shown compactly
  var NEAR_BOTTOM = 48;       // px: a reader this close to the end of the log is kept there as it grows
  // ms a turn may stay queued before the status line says it waits for the assistant: a worker
  // normally takes a turn within a second, so longer means none is free (or none runs).
  var QUEUED_NOTICE = 4000;
  // A conversation handed to a person is polled from HANDOFF_FIRST_DELAY after each change,
  // backing off to HANDOFF_MAX_DELAY: a staff reply shows within about that plus a request (p95
  // goal 1.2 s), at under one request a second while nothing changes (docs/benchmarks.md).
  var HANDOFF_FIRST_DELAY = 500;
  var HANDOFF_MAX_DELAY = 1000;
  var widgets = 0;
  var sourceLists = 0;       // ids of the sources lists (their headings label them)

  function fmt(text, values) {
    return text.replace(/%\((\w+)\)s/g, function (all, key) { return key in values ? values[key] : all; });
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) { node.className = className; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  function readCookie(name) {
    var match = document.cookie.match(new RegExp("(?:^|;\\s*)" + name + "=([^;]+)"));
    return match ? decodeURIComponent(match[1]) : "";
  }

  // -- safe rendering: a small markdown subset built with DOM APIs -------------------------

  var INLINE = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\*([^*\s][^*\n]*)\*|\[([^\]\n]+)\]\(([^)\s]+)\)|(https?:\/\/[^\s<>()"]+[^\s<>()".,;:!?])/g;

  function safeUrl(url) {
    try {
      var parsed = new URL(url);
      return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
    } catch (e) {
      return null;
    }
  }

  function link(href, text) {
    var a = el("a", "", text);
    a.href = href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    return a;
  }

  function inline(text, into) {
    var last = 0, match;
    INLINE.lastIndex = 0;
    while ((match = INLINE.exec(text))) {
      into.appendChild(document.createTextNode(text.slice(last, match.index)));
      var href = match[5] ? safeUrl(match[5]) : match[6] ? safeUrl(match[6]) : null;
      if (match[1]) { into.appendChild(el("code", "", match[1])); }
      else if (match[2]) { into.appendChild(el("strong", "", match[2])); }
      else if (match[3]) { into.appendChild(el("em", "", match[3])); }
      else if (href) { into.appendChild(link(href, match[4] || match[6])); }
      else { into.appendChild(document.createTextNode(match[0])); } // a link that is not http(s): inert text
      last = INLINE.lastIndex;
    }
    into.appendChild(document.createTextNode(text.slice(last)));
  }

  var ITEM = /^\s*([-*+]|\d{1,3}[.)])\s+(.*)$/;

  function renderMarkdown(text, into) {
    var lines = text.replace(/\r\n?/g, "\n").split("\n");
    var para = [], i = 0, match;
    function flush() {
      if (para.length) { var p = el("p"); inline(para.join("\n"), p); into.appendChild(p); para = []; }
    }
    while (i < lines.length) {
      if (/^\s*```/.test(lines[i])) {
        flush();
        var code = [];
        for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) { code.push(lines[i]); }
        var pre = el("pre");
        pre.appendChild(el("code", "", code.join("\n")));
        into.appendChild(pre);
        i++;
      } else if ((match = ITEM.exec(lines[i]))) {
        flush();
        var ordered = /\d/.test(match[1]);
        var list = el(ordered ? "ol" : "ul");
        while (i < lines.length && (match = ITEM.exec(lines[i])) && /\d/.test(match[1]) === ordered) {
          var item = el("li");
          inline(match[2], item);
          list.appendChild(item);
          i++;
        }
        into.appendChild(list);
      } else {
        if (lines[i].trim()) { para.push(lines[i]); } else { flush(); }
        i++;
      }
    }
    flush();
  }

  function compact(text) {
    text = String(text || "").replace(/\s+/g, " ").trim();
    return text.length > RESULT_CHARS ? text.slice(0, RESULT_CHARS - 1) + "…" : text;
  }

  /* Draw `text` (an assistant message, complete or still growing) into `into`, touching only
   * what changed: blocks equal to the ones shown stay the same nodes, so a streamed answer grows
   * without its finished paragraphs being rebuilt (no flicker, a selection in them survives). */
  function patch(into, text) {
    var fresh = el("div");
    renderMarkdown(text, fresh);
    var blocks = Array.prototype.slice.call(fresh.childNodes), shown = into.childNodes;
    blocks.forEach(function (block, i) {
      if (!shown[i]) { into.appendChild(block); }
      else if (!shown[i].isEqualNode(block)) { into.replaceChild(block, shown[i]); }
    });
    while (shown.length > blocks.length) { into.removeChild(into.lastChild); }
  }
  // -- the API client: its token, its requests, its sentences -------------------------------

  /* Every request the widget makes but the polling itself goes through here: JSON in and out,
   * the CSRF token on writes, and an Error whose message is the server's sentence. A widget
   * embedded on another site (embed.js gives it data-token-url) sends a visitor token instead
   * of cookies and a CSRF token, and renews it before it expires (see docs/widget.md). */
  class ApiClient {
    constructor(apiUrl, options) {
      this.apiUrl = apiUrl;
      this.tokenUrl = options.tokenUrl || "";
      this.bearer = options.token || "";
      this.visitor = options.visitor || "";
      this.assistant = options.assistant || "";
      // A signed-in user's token is renewed only by itself: a new one without the host site's
      // signature would be an anonymous visitor's, who owns none of the user's conversations.
      this.anonymous = !options.identified;
      this.renewing = null;
      // With a token no cookie is ever sent (a browser would block them as third-party anyway).
      this.credentials = this.tokenUrl ? "omit" : new URL(apiUrl).origin === location.origin ? "same-origin" : "include";
      this.csrf = options.csrfToken || "";
      this.csrfCookie = options.csrfCookie || "csrftoken";
      this.sendFailed = options.sendFailed; // the sentence when the server cannot be reached
      if (this.tokenUrl) { this.renewIn(Number(options.expiresIn) || 0); }
    }

    /* An URL the API handed out (maybe relative to it) as an absolute one. */
    resolve(path) { return new URL(path, this.apiUrl).href; }

    /* `headers` with the visitor token, when there is one. */
    authorize(headers) {
      if (this.bearer) { headers.Authorization = "Bearer " + this.bearer; }
      return headers;
    }

    /* Renew the token when two thirds of its `seconds` have passed. */
    renewIn(seconds) {
      var self = this;
      clearTimeout(this.renewTimer);
      this.renewTimer = setTimeout(function () { self.renew().catch(function () { /* the next request says why */ }); },
                                   Math.max(5, seconds * 2 / 3) * 1000);
    }

    /* A fresh token for the same visitor: the current one sent to be renewed, else (it expired while
     * the tab slept, or its chain of renewals reached WIDGET_TOKEN_MAX_AGE: 401) a new one for the
     * visitor id; a signed-in user's widget shows the 401's sentence instead (a reload signs them in
     * again). Resolves once it is in place. */
    renew() {
      var self = this;
      if (!this.renewing) {
        this.renewing = this.mint(true).catch(function (error) {
          if (error.status === 401 && self.anonymous) { return self.mint(false); }
          throw error;
        }).finally(function () { self.renewing = null; });
      }
      return this.renewing;
    }

    mint(renewal) {
      var self = this, body = { assistant: this.assistant, visitor: this.visitor }; // a renewal: the token decides
      var headers = { "Accept": "application/json", "Content-Type": "application/json" };
      return fetch(this.tokenUrl, { method: "POST", credentials: "omit", body: JSON.stringify(body),
                                    headers: renewal ? this.authorize(headers) : headers })
        .catch(function () { throw new Error(self.sendFailed); })
        .then(function (response) { return self.parse(response); })
        .then(function (data) { self.bearer = data.token; self.renewIn(data.expires_in); });
    }

    token() {
      // data-csrf-token (the template tag sets it), else Django's cookie; on a page Django did
      // not render the visitor may have none yet, and the API's GET sets it.
      var self = this;
      var known = this.csrf || readCookie(this.csrfCookie);
      if (known) { return Promise.resolve(known); }
      return fetch(this.apiUrl, { credentials: this.credentials, headers: { "Accept": "application/json" } })
        .catch(function () { return null; })
        .then(function () { return readCookie(self.csrfCookie); });
    }

    /* Resolves with the JSON body; rejects with an Error whose message is the server's sentence.
     * A token refused (401: expired meanwhile) is renewed and the request made once more. */
    request(method, url, body, extraHeaders, retried) {
      var self = this;
      var ready = method === "GET" || this.tokenUrl ? Promise.resolve("") : this.token();
      return ready.then(function (token) {
        var options = { method: method, credentials: self.credentials,
                        headers: self.authorize({ "Accept": "application/json" }) };
        if (method !== "GET") {
          options.headers["Content-Type"] = "application/json";
          if (!self.tokenUrl) { options.headers["X-CSRFToken"] = token; }
          options.body = JSON.stringify(body || {});
        }
        Object.assign(options.headers, extraHeaders || {});
        return fetch(url, options).catch(function () { throw new Error(self.sendFailed); });
      }).then(function (response) {
        if (response.status === 401 && self.tokenUrl && !retried) {
          return self.renew().then(function () { return self.request(method, url, body, extraHeaders, true); });
        }
        return self.parse(response);
      });
    }

    parse(response) {
      var self = this;
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (response.ok) { return data; }
        var error = new Error(self.problem(data));
        error.status = response.status;
        throw error;
      });
    }

    problem(data) {
      if (data && typeof data.detail === "string") { return data.detail; }
      for (var key in data || {}) {
        if (Array.isArray(data[key]) && typeof data[key][0] === "string") { return data[key][0]; }
      }
      return this.sendFailed;
    }
  }

  // -- the poller: one turn followed until it ends (no DOM) ---------------------------------

  /* Follows one turn at a time: looks at its poll URL with its ETag, backs off while nothing
   * changes, does not look while the tab is hidden, and gives up `jobTimeout + giveUpMargin`
   * seconds after the message was sent. It tells the widget through `events`:
   *   changed(turn, state) -> whether an answer is still being streamed (a new version landed;
   *                           `turn.approvals` already holds the calls it waits for a person to decide)
   *   looked(turn, recovered)  after every look that landed, changed or not
   *   lost(turn)               a look failed (network, 5xx); it tries again, backing off
   *   ended(turn, state)       the turn is over (or given up on, or gone); it is no longer followed
   * A turn has at most one look at a time: `timer`, the next one scheduled, or `request`, the
   * one in flight. stop() drops both and the document listener; start() takes them up again. */
  class Poller {
    constructor(client, limits, events) {
      this.client = client;
      this.limits = limits;
      this.events = events;
      this.turn = null;
      this.running = false;
      var self = this;
      // A hidden tab does not poll: its next look is dropped (a request in flight still lands, and
      // schedules nothing); shown again, it looks at once unless a look is already under way.
      this.onVisibility = function () {
        var turn = self.turn;
        if (!turn) { return; }
        if (document.hidden && turn.timer) { clearTimeout(turn.timer); turn.timer = null; }
        else if (!document.hidden && !turn.timer && !turn.request) { self.poll(); }
      };
      this.start();
    }

    start() {
      if (this.running) { return; }
      this.running = true;
      document.addEventListener("visibilitychange", this.onVisibility);
      if (this.turn) { this.poll(); } // taken up again (the element was put back in a page)
    }

    /* No timer, no request in flight, no listener left: the turn stays known, for start(). */
    stop() {
      if (!this.running) { return; }
      this.running = false;
      document.removeEventListener("visibilitychange", this.onVisibility);
      var turn = this.turn;
      if (!turn) { return; }
      if (turn.timer) { clearTimeout(turn.timer); turn.timer = null; }
      // The look in flight is dropped: aborted, and whatever it brings is ignored (`look`).
      if (turn.controller) { turn.controller.abort(); }
      turn.request = turn.controller = null;
      turn.look += 1;
    }

    /* Follow the turn `summary` (the API's turn summary), sent at `since` (ms). */
    follow(summary, since, extra) {
      this.turn = Object.assign({
        id: summary.id, pollUrl: this.client.resolve(summary.poll_url), cancelUrl: this.client.resolve(summary.cancel_url),
        ratingUrl: summary.rating_url ? this.client.resolve(summary.rating_url) : "",
        approvalUrl: summary.approval_url ? this.client.resolve(summary.approval_url) : "",
        etag: null, delay: FIRST_DELAY, errors: 0, since: since, timer: null, request: null, controller: null, look: 0,
        giveUpAt: since + (this.limits.jobTimeout + this.limits.giveUpMargin) * 1000 }, extra || {});
      return this.turn;
    }

    schedule(delay) {
      var self = this, turn = this.turn;
      if (!turn || !this.running || document.hidden) { return; } // a hidden tab looks again when shown
      turn.timer = setTimeout(function () { turn.timer = null; self.poll(); }, delay);
    }

    /* Look now rather than after the current back-off (e.g. Stop was accepted: the turn may be over). */
    hurry(turn) {
      if (this.turn !== turn) { return; }
      turn.delay = FIRST_DELAY;
      if (turn.timer) { clearTimeout(turn.timer); turn.timer = null; this.poll(); }
    }

    poll() {
      var self = this, turn = this.turn;
      if (!turn || !this.running || turn.timer || turn.request || document.hidden) { return; }
      if (Date.now() >= turn.giveUpAt) { this.end(turn, { status: "timeout" }); return; }
      var headers = { "Accept": "application/json" };
      if (turn.etag) { headers["If-None-Match"] = turn.etag; }
      var controller = turn.controller = window.AbortController ? new AbortController() : null;
      var abort = controller && setTimeout(function () { controller.abort(); }, REQUEST_TIMEOUT);
      var look = turn.look;
      var landed = function () { // whether the turn is still the one followed, once its look is over
        clearTimeout(abort);
        if (turn.look !== look) { return false; } // dropped by stop()
        turn.request = turn.controller = null;
        return self.turn === turn && self.running;
      };
      turn.request = fetch(turn.pollUrl, { credentials: this.client.credentials, cache: "no-store",
                            headers: this.client.authorize(headers),
                            signal: controller && controller.signal }).then(function (response) {
        if (response.status === 304) { return null; }
        if (response.status === 401) { // the token expired meanwhile: renewed, and looked at again
          self.client.renew().catch(function () { /* looked at again all the same, backing off */ });
          throw new Error("HTTP 401");
        }
        if (response.status === 404 || response.status === 403) {
          // 403: no longer allowed (e.g. signed out on a site for signed-in visitors): its sentence.
          return response.json().catch(function () { return {}; }).then(function (data) {
            return { done: true, status: "gone", error: response.status === 403 && data.detail };
          });
        }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        turn.etag = response.headers.get("ETag");
        return response.json();
      }).then(function (state) {
        if (!landed()) { return; }
        var recovered = turn.errors > 0;
        turn.errors = 0;
        // Nothing new: a 304, or a server that ignores ETags. An ending is always new (a "gone"
        // turn has no version, and neither has a turn before its first state). While a message is
        // streamed the look stays quick, since its text is still growing.
        if (!state || (!state.done && state.version === turn.version)) {
          turn.delay = turn.streaming ? FIRST_DELAY : Math.min(turn.delay * GROWTH, MAX_DELAY);
        } else {
          turn.version = state.version;
          // The calls it waits for a person to decide, worked out once: the widget draws them from here.
          turn.approvals = state.status === "waiting_approval" ? (state.approvals || []) : [];
          turn.streaming = self.events.changed(turn, state);
          turn.resuming = Boolean(state.resuming);  // its worker died: another takes the answer over
          // Waiting for a person costs the turn no time: it may go on until the approval expires,
          // then for a whole job's time.
          turn.approvals.forEach(function (a) {
            turn.giveUpAt = Math.max(turn.giveUpAt, (Number(a.expires_at) + self.limits.jobTimeout +
                                                     self.limits.giveUpMargin) * 1000);
          });
          if (state.done) { self.end(turn, state); return; }
          turn.delay = FIRST_DELAY;
        }
        self.events.looked(turn, recovered);
        self.schedule(turn.delay);
      }).catch(function () {
        if (!landed()) { return; }
        turn.errors += 1;
        self.events.lost(turn);
        self.schedule(Math.min(FIRST_DELAY * Math.pow(2, turn.errors), MAX_RETRY_DELAY));
      });
    }

    end(turn, state) {
      if (turn.timer) { clearTimeout(turn.timer); }
      this.turn = null;
      this.events.ended(turn, state);
    }
  }

  // -- the rating control -------------------------------------------------------------------

  /* A thumb drawn as SVG: an emoji would need an emoji font, which many systems lack. Turned
   * upside down by the stylesheet for "not helpful". */
  function thumb() {
    var ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
    var path = document.createElementNS(ns, "path");
    svg.setAttribute("viewBox", "0 0 16 16");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    path.setAttribute("d", "M1 7h3v8H1zM6 7l3-5.5c1 0 2 .8 1.6 2.1L10 6.5h4c1 0 1.6.9 1.3 1.8L13.6 14c-.2.6-.7 1-1.3 1H6z");
    svg.appendChild(path);
    return svg;
  }

  /* Thumbs up and down under one finished answer, then (once one is chosen) an optional
   * comment. Each choice is posted at once to `url` (the API's rating_url) and may be changed;
   * `saved` is the rating given before a reload ({value, comment}). `item` is its element;
   * `announce` reads a sentence out. */
  class RatingControl {
    constructor(options) {
      var self = this, s = this.strings = options.strings;
      this.client = options.client;
      this.url = options.url;
      this.announce = options.announce;
      this.rating = { value: options.saved ? options.saved.value : "", comment: options.saved ? options.saved.comment : "" };
      this.busy = false;
      this.buttons = {};
      var item = this.item = el("li", "cvw-rate"), top = el("div", "cvw-rate-top"), group = el("div", "cvw-thumbs");
      group.setAttribute("role", "group");
      group.setAttribute("aria-label", s.rate);
      var input = this.input = el("input", "cvw-comment-input");
      [["up", s.rate_up], ["down", s.rate_down]].forEach(function (choice) {
        var button = self.buttons[choice[0]] = el("button", "cvw-thumb cvw-thumb-" + choice[0]);
        button.type = "button";
        button.appendChild(thumb());
        button.appendChild(document.createTextNode(choice[1]));
        // The comment box's text goes with it, sent or not: a change of mind loses nothing typed.
        button.addEventListener("click", function () { self.send({ value: choice[0], comment: input.value.trim() }); });
        group.appendChild(button);
      });
      var form = this.form = el("form", "cvw-comment");
      var label = el("label", "", s.comment_label);
      label.htmlFor = input.id = options.id;
      input.type = "text";
      input.maxLength = options.maxLength;
      input.value = this.rating.comment;
      var submit = el("button", "cvw-comment-send", s.comment_send);
      submit.type = "submit";
      [label, input, submit].forEach(function (node) { form.appendChild(node); });
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        self.send({ value: self.rating.value, comment: input.value.trim() });
      });
      this.said = el("p", "cvw-rate-said");
      top.appendChild(group);
      top.appendChild(this.said);
      item.appendChild(top);
      item.appendChild(form);
      this.show();
    }

    show() {
      var rating = this.rating, buttons = this.buttons;
      Object.keys(buttons).forEach(function (value) {
        buttons[value].setAttribute("aria-pressed", String(rating.value === value));
      });
      this.form.hidden = !rating.value;
    }

    send(body) {
      var self = this, said = this.said;
      if (this.busy) { return; }
      this.busy = true;
      this.client.request("POST", this.url, body).then(function (data) {
        self.rating = { value: data.value, comment: data.comment };
        self.show();
        said.className = "cvw-rate-said";
        said.textContent = self.strings.rated;
        self.announce(self.strings.rated);
      }, function (error) {
        said.className = "cvw-rate-said cvw-status-problem";
        said.textContent = error.message;
        self.announce(error.message);
      }).then(function () { self.busy = false; });
    }
  }


  // -- a conversation handed to a person ----------------------------------------------------

  /* Follows a conversation's handoff state (`url`, the API's …/handoff/) while staff hold it:
   * its ETag, backing off while nothing changes, no look while the tab is hidden (one at once
   * when it is shown again). `changed(state)` gets each new version; it returns whether to go on. */
  class ConversationPoller {
    constructor(client, url, changed) {
      var self = this;
      this.client = client;
      this.url = url;
      this.changed = changed;
      this.etag = null;
      this.delay = HANDOFF_FIRST_DELAY;
      this.timer = null;
      this.request = null;
      this.running = false;
      this.onVisibility = function () {
        if (document.hidden && self.timer) { clearTimeout(self.timer); self.timer = null; }
        else if (!document.hidden && !self.timer && !self.request) { self.poll(); }
      };
    }

    start() {
      if (this.running) { return; }
      this.running = true;
      document.addEventListener("visibilitychange", this.onVisibility);
      this.poll();
    }

    stop() {
      this.running = false;
      document.removeEventListener("visibilitychange", this.onVisibility);
      if (this.timer) { clearTimeout(this.timer); this.timer = null; }
    }

    /* Look now (the visitor just wrote, or asked): the next change is likely soon. */
    hurry() {
      this.delay = HANDOFF_FIRST_DELAY;
      if (this.timer) { clearTimeout(this.timer); this.timer = null; this.poll(); }
    }

    schedule() {
      var self = this;
      if (!this.running || document.hidden || this.timer) { return; }
      this.timer = setTimeout(function () { self.timer = null; self.poll(); }, this.delay);
    }

    poll() {
      var self = this;
      if (!this.running || this.request || document.hidden) { return; }
      var headers = { "Accept": "application/json" };
      if (this.etag) { headers["If-None-Match"] = this.etag; }
      // With the visitor token too: an embedded widget sends no cookie.
      this.request = fetch(this.url, { credentials: this.client.credentials, cache: "no-store",
                                       headers: this.client.authorize(headers) })
        .then(function (response) {
          if (response.status === 304) { return null; }
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          self.etag = response.headers.get("ETag");
          return response.json();
        }).then(function (state) {
          self.request = null;
          if (!self.running) { return; }
          if (!state) { self.delay = Math.min(self.delay * GROWTH, HANDOFF_MAX_DELAY); }
          else {
            self.delay = HANDOFF_FIRST_DELAY;
            if (!self.changed(state)) { self.stop(); return; }
          }
          self.schedule();
        }).catch(function () {
          self.request = null;
          self.delay = Math.min(self.delay * 2, MAX_RETRY_DELAY);
          self.schedule();
        });
    }
  }

  /* The "Talk to a person" button (where the assistant offers it), the line that says what staff
   * are doing (waiting, a person joined, handed back, closed), a way back to the assistant when
   * no one took it in time, and staff messages in the log, drawn as text. `widget` is the
   * Widget; `offered`: the button is shown. */
  class HandoffControl {
    constructor(widget, offered) {
      var self = this, s = widget.strings;
      this.widget = widget;
      this.strings = s;
      this.state = "";
      this.poller = null;
      this.button = el("button", "cvw-handoff-ask", s.talk_to_person);
      this.button.type = "button";
      this.offered = offered;
      this.button.hidden = !offered;
      this.button.addEventListener("click", function () { self.ask(); });
      this.line = el("div", "cvw-handoff");
      this.line.setAttribute("role", "status");
      this.line.hidden = true;
      this.text = el("span", "cvw-handoff-text");
      this.back = el("button", "cvw-handoff-back", s.back_to_assistant);
      this.back.type = "button";
      this.back.hidden = true;
      this.back.addEventListener("click", function () { self.goBack(); });
      this.line.appendChild(this.text);
      this.line.appendChild(this.back);
    }

    /* Whether staff hold the conversation: messages go to them, and no turn starts. */
    get held() { return this.state === "waiting" || this.state === "taken"; }

    url(path) { return this.widget.apiUrl + this.widget.conversationId + "/handoff/" + (path || ""); }

    ask() {
      var self = this, widget = this.widget;
      this.button.disabled = true;
      widget.ensureConversation().then(function () {
        return widget.client.request("POST", self.url(), {});
      }).then(function (state) {
        self.show(state);
        self.follow();
      }, function (error) {
        widget.setStatusLine(error.message, true);
        widget.announce(error.message);
      }).then(function () { self.button.disabled = false; });
    }

    goBack() {
      var self = this;
      this.widget.client.request("POST", this.url("back/"), {}).then(function (state) {
        self.show(state);
      }, function (error) { self.widget.setStatusLine(error.message, true); });
    }

    /* After a reload, or once a turn ended with the assistant's hand_to_person tool. */
    resume(state, quiet) {
      if (!state) { return; }
      this.show({ state: state, by: null, messages: [], expired: false }, quiet);
      if (this.held) { this.follow(); }
    }

    follow() {
      var self = this;
      if (!this.poller) {
        this.poller = new ConversationPoller(this.widget.client, this.url(), function (state) {
          self.show(state);
          return self.held;
        });
      }
      this.poller.start();
    }

    /* A message kept for staff that a poll brought before its POST answered: it takes over the
     * bubble shown while it was posted (the same text, still pending) rather than a second one. */
    adopt(message) {
      var shown = this.widget.list.querySelectorAll(".cvw-msg-user.cvw-pending");
      for (var i = 0; i < shown.length; i++) {
        if (shown[i].textContent === message.content) { shown[i].classList.remove("cvw-pending"); return true; }
      }
      return false;
    }

    /* The visitor's message was kept for staff (the API's 202 {"handoff", "message"}). */
    kept(data, pending) {
      this.widget.nodes["m" + data.message.id] = true; // drawn already: the pending bubble
      pending.classList.remove("cvw-pending");
      if (this.poller) { this.poller.hurry(); } else { this.follow(); }
    }

    /* Draw a new handoff state: its messages (each once), and the line. `quiet`: a state read
     * back after a reload, announced as nothing new. */
    show(state, quiet) {
      var s = this.strings, widget = this.widget, before = this.state;
      (state.messages || []).forEach(function (m) { widget.draw(m, m.turn); });
      this.state = state.state;
      var sentence = { waiting: state.expired ? s.handoff_expired : s.handoff_waiting,
                       taken: fmt(s.handoff_taken, { name: state.by || "" }) }[this.state] || "";
      this.line.hidden = !sentence;
      this.text.textContent = sentence;
      this.back.hidden = !(this.state === "waiting" && state.expired);
      this.button.hidden = !this.offered || this.held || this.state === "closed";
      var news = !quiet && (before !== this.state || state.expired !== this.expired);
      var ended = { returned: s.handoff_returned, closed: s.handoff_closed }[this.state];
      if (news && ended) { widget.notice(ended); }
      if (news && (ended || sentence)) { widget.announce(ended || sentence); }
      this.expired = state.expired;
      // Closed: neither staff nor the assistant answer any more (otherwise Send follows the widget's status).
      if (this.state === "closed") { widget.input.disabled = widget.sendButton.disabled = true; }
      else if (widget.input.disabled) { widget.input.disabled = false; widget.sendButton.disabled = STATUSES[widget.status]; }
    }

    /* A staff message: its author's name (the site's choice) above the text, both as text. */
    bubble(message) {
      var item = el("li", "cvw-msg cvw-msg-staff");
      item.appendChild(el("span", "cvw-author", message.author || ""));
      item.appendChild(el("span", "cvw-staff-text", message.content));
      return item;
    }

    stop() { if (this.poller) { this.poller.stop(); } }

    start() { if (this.poller && this.held) { this.poller.start(); } }
  }

  // -- the widget ---------------------------------------------------------------------------

  /* idle: nothing sent yet; sending: a message is being posted; waiting: its turn is queued or
   * not yet seen running; running: the turn runs and its steps land; stopping: Stop was
   * pressed and the turn has not ended yet; ended: the last turn ended (answered or not).
   * true: the visitor must wait (Send disabled, Stop shown). */
  var STATUSES = { idle: false, sending: true, waiting: true, running: true, stopping: true, ended: false };

  /* One widget per host element: created by start() (or the custom element) for each. */
  // -- the sources of an answer: the pages the site's search_site tool returned ---------------

  /* A link target for a source: a URL of the site the articles belong to, over http(s) (a path
   * on it, or an absolute URL of its origin `site`), else null (the title is then shown as text). */
  function siteLink(url, site) {
    try {
      var parsed = new URL(url, site + "/");
      var web = parsed.protocol === "http:" || parsed.protocol === "https:";
      return web && parsed.origin === site ? parsed.href : null;
    } catch (e) {
      return null;
    }
  }

  class SourceList {
    /* The sources are pages of the API's site (`apiUrl`): the page's own origin on the site's
     * pages, another one when the widget is embedded on a page of another site (embed.js). */
    constructor(apiUrl) { this.site = new URL(apiUrl).origin; this.byTurn = {}; }

    /* Keep the results of a search_site tool message of `turnId` (its content is the tool's JSON). */
    collect(message, turnId) {
      if (message.role !== "tool" || message.name !== "search_site" || message.is_error) { return; }
      var found;
      try { found = JSON.parse(message.content).results; } catch (e) { return; }
      var kept = this.byTurn[turnId] = this.byTurn[turnId] || [];
      (Array.isArray(found) ? found : []).forEach(function (hit) {
        if (!hit || typeof hit.title !== "string" || typeof hit.url !== "string") { return; }
        if (!kept.some(function (k) { return k.url === hit.url; })) { kept.push({ title: hit.title, url: hit.url }); }
      });
    }

    /* The list item to put under the answer of `turnId`, or null when its searches found nothing. */
    item(turnId, label) {
      var kept = this.byTurn[turnId];
      if (!kept || !kept.length) { return null; }
      var item = el("li", "cvw-msg cvw-sources"), id = "cvw-sources-" + (++sourceLists);
      var heading = el("span", "cvw-sources-label", label);
      heading.id = id;
      var list = el("ul", "cvw-sources-list");
      list.setAttribute("aria-labelledby", id);
      var site = this.site;
      kept.forEach(function (hit) {
        var entry = el("li"), href = siteLink(hit.url, site);
        entry.appendChild(href ? link(href, hit.title || href) : el("span", "", hit.title));
        list.appendChild(entry);
      });
      item.appendChild(heading);
      item.appendChild(list);
      return item;
    }
  }

  class Widget {
    constructor(host) {
      var self = this, data = host.dataset;
      var given = host.querySelector("script[type='application/json']");
      this.host = host;
      this.strings = Object.assign({}, STRINGS, given ? JSON.parse(given.textContent) : {},
                                   data.strings ? JSON.parse(data.strings) : {});
      this.mode = data.mode === "launcher" ? "launcher" : "inline";
      this.apiUrl = new URL((data.apiUrl || "/api/conversations/").replace(/\/?$/, "/"), location.href).href;
      this.client = new ApiClient(this.apiUrl, { csrfToken: data.csrfToken, csrfCookie: data.csrfCookie,
                                                 sendFailed: this.strings.send_failed,
                                                 // Set by embed.js, for a page of another site.
                                                 tokenUrl: data.tokenUrl, token: data.token,
                                                 expiresIn: data.tokenExpires, visitor: data.visitor,
                                                 assistant: data.assistant, identified: data.identified === "true" });
      // The tag passes the server's own values; the defaults are for an element written by hand.
      this.maxLength = Number(data.maxLength || 4000);
      this.commentMaxLength = Number(data.commentMaxLength || 500);
      this.poller = new Poller(this.client, { jobTimeout: Number(data.jobTimeout || 120),
                                              giveUpMargin: Number(data.giveUpMargin || 30) }, {
        changed: function (turn, state) { return self.changed(turn, state); },
        looked: function (turn, recovered) { self.looked(turn, recovered); },
        lost: function () { self.setStatusLine(self.strings.reconnecting, true); },
        ended: function (turn, state) { self.end(turn, state); }
      });
      // The assistant this widget talks to ({% chat_widget assistant=… %}), its greeting and the
      // questions it suggests before the first message.
      this.assistant = data.assistant || "";
      this.greeting = data.greeting || "";
      this.suggestions = data.suggestions ? JSON.parse(data.suggestions) : [];
      // Each widget of a page keeps its own conversation: its data-key, else its place on the page
      // (so the first widget of every page of the site goes on with the same conversation).
      this.n = ++widgets;
      this.storageKey = "cvw:" + this.apiUrl + "#" + (data.key || this.n);
      this.conversationId = null;
      // What the widget is doing, one of STATUSES; the controls follow from it (setState).
      this.status = "idle";
      this.unsent = null;    // the last message whose POST failed, and its Idempotency-Key
      this.stopWanted = false; // Stop pressed while the message was still being posted
      this.growing = null;   // the element of the assistant message being streamed, if any
      this.answers = {};     // turn id -> the element of its last assistant message (rated under it)
      this.ratingUrls = {};  // turn id -> its rating_url, as the API handed it out
      this.nodes = {};
      this.sources = new SourceList(this.apiUrl);
      this.build(data.cssUrl || CSS_URL, data.loginUrl);
      if (data.loginUrl) { this.poller.stop(); return; } // signed-in visitors only: the link, nothing to send
      this.handoff = new HandoffControl(this, !!data.handoff);
      this.panel.insertBefore(this.handoff.line, this.form);
      // In the header, beside the title: offered before the visitor writes, not only after. Only
      // where the assistant offers it (the tool alone hands over without any button).
      if (data.handoff) { this.panel.querySelector(".cvw-header").insertBefore(this.handoff.button, this.closeButton || null); }
      this.bind();
      this.restore();
    }

    /* The turn being followed (waiting, running, stopping), or null. */
    get turn() { return this.poller.turn; }

    /* The element left the page: nothing of it keeps running. */
    disconnect() { this.poller.stop(); if (this.handoff) { this.handoff.stop(); } }

    /* The element came back (moved in the page): a turn it followed is looked at again. */
    reconnect() { if (this.form) { this.poller.start(); this.handoff.start(); } }

    build(cssUrl, loginUrl) {
      var s = this.strings, n = this.n, launcher = this.mode === "launcher";
      var shadow = this.shadow = this.host.attachShadow({ mode: "open" });
      // Shown once its stylesheet has loaded (or failed to: unstyled beats invisible).
      var frame = this.frame = el("div", "cvw cvw-mode-" + this.mode);
      if (cssUrl) {
        var sheet = el("link");
        sheet.rel = "stylesheet";
        sheet.href = cssUrl;
        frame.hidden = true;
        // A conversation restored while the frame was hidden could not scroll (nothing has a
        // height then): once shown, the log starts at its newest message.
        var self = this;
        sheet.onload = sheet.onerror = function () {
          frame.hidden = false;
          if (self.log) { self.log.scrollTop = self.log.scrollHeight; }
        };
        shadow.appendChild(sheet);
      }
      shadow.appendChild(frame);
      var panel = this.panel = el("section", "cvw-panel");
      panel.id = "cvw-panel-" + n;
      panel.setAttribute("aria-label", s.region);
      var header = el("div", "cvw-header");
      header.appendChild(el("span", "cvw-title", s.title));
      panel.appendChild(header);
      if (launcher) {
        // A panel over the page that does not block it: a non-modal dialog, no focus trap.
        panel.setAttribute("role", "dialog");
        panel.hidden = true;
        this.launcher = el("button", "cvw-launcher", s.title);
        this.launcher.type = "button";
        this.launcher.setAttribute("aria-expanded", "false");
        this.launcher.setAttribute("aria-controls", panel.id);
        this.closeButton = el("button", "cvw-close", "×");
        this.closeButton.type = "button";
        this.closeButton.setAttribute("aria-label", s.close);
        header.appendChild(this.closeButton);
        frame.appendChild(this.launcher);
      }
      frame.appendChild(panel);
      if (loginUrl) {
        var signIn = el("p", "cvw-signin"), a = el("a", "", s.sign_in);
        a.href = loginUrl;
        signIn.appendChild(a);
        panel.appendChild(signIn);
        if (launcher) { this.bindLauncher(); }
        return;
      }
      // The log role is on a wrapper, so the list inside keeps its own (list, listitem) semantics.
      // aria-live off because steps land every poll: only finished answers and endings are read
      // out, through the separate announcer below.
      this.log = el("div", "cvw-log");
      this.log.setAttribute("role", "log");
      this.log.setAttribute("aria-live", "off");
      this.log.setAttribute("aria-label", s.log);
      this.log.tabIndex = 0;
      this.list = el("ol", "cvw-list");
      this.log.appendChild(this.list);
      this.statusLine = el("p", "cvw-status");
      // Outside the panel: a closed launcher panel is display:none, and so would be its live region.
      this.announcer = el("div", "cvw-sr");
      this.announcer.setAttribute("aria-live", "polite");
      this.form = el("form", "cvw-form");
      var label = el("label", "cvw-label", s.label);
      label.htmlFor = "cvw-input-" + n;
      this.input = el("textarea", "cvw-input");
      this.input.id = label.htmlFor;
      this.input.rows = 2;
      this.input.maxLength = this.maxLength;
      this.input.setAttribute("aria-describedby", "cvw-hint-" + n);
      var hint = el("span", "cvw-hint", s.hint);
      hint.id = "cvw-hint-" + n;
      var actions = el("div", "cvw-actions");
      this.sendButton = el("button", "cvw-send", s.send);
      this.sendButton.type = "submit";
      this.stopButton = el("button", "cvw-stop", s.stop);
      this.stopButton.type = "button";
      this.stopButton.hidden = true;
      actions.appendChild(this.sendButton);
      actions.appendChild(this.stopButton);
      [label, this.input, actions, hint].forEach(function (node) { this.form.appendChild(node); }, this);
      // How long the chat is kept (where the site says so), and the visitor's own erasure of it.
      this.privacy = el("div", "cvw-privacy");
      if (s.retention) { this.privacy.appendChild(el("span", "cvw-retention", s.retention)); }
      this.deleteButton = el("button", "cvw-delete", s.delete_conversation);
      this.deleteButton.type = "button";
      this.deleteButton.hidden = true;
      this.privacy.appendChild(this.deleteButton);
      [this.log, this.statusLine, this.form, this.privacy].forEach(function (node) { panel.appendChild(node); });
      frame.appendChild(this.announcer);
    }

    /* The element focus is on inside this widget (its shadow root's), or null. */
    focused() { return this.shadow.activeElement; }

    bindLauncher() {
      var self = this;
      this.launcher.addEventListener("click", function () { self.setOpen(self.panel.hidden); });
      this.closeButton.addEventListener("click", function () { self.setOpen(false); });
      this.frame.addEventListener("keydown", function (event) {
        if (event.key === "Escape" && !self.panel.hidden && !event.isComposing) { event.preventDefault(); self.setOpen(false); }
      });
    }

    /* Open or close the launcher's panel: opening puts focus where the visitor types, closing
     * gives it back to the launcher. */
    setOpen(open) {
      this.panel.hidden = !open;
      this.launcher.setAttribute("aria-expanded", String(open));
      this.frame.classList.toggle("cvw-open", open);
      if (!open) { this.launcher.focus(); return; }
      var target = this.input || this.panel.querySelector("a");
      target.focus();
      if (this.log) { this.log.scrollTop = this.log.scrollHeight; }
    }

    bind() {
      var self = this;
      if (this.launcher) { this.bindLauncher(); }
      this.form.addEventListener("submit", function (event) { event.preventDefault(); self.submit(); });
      this.input.addEventListener("keydown", function (event) {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); self.submit(); }
      });
      this.stopButton.addEventListener("click", function () { self.cancel(); });
      this.deleteButton.addEventListener("click", function () { self.deleteConversation(); });
    }

    /* The visitor deletes the conversation everywhere (after confirming): the server stops its
     * turn and erases it; the widget starts afresh. */
    deleteConversation() {
      var self = this, id = this.conversationId;
      if (!id || !window.confirm(this.strings.delete_confirm)) { return; }
      this.deleteButton.disabled = true;
      this.client.request("DELETE", this.apiUrl + id + "/").then(function () {
        self.poller.stop();
        self.poller.turn = null;
        self.handoff.stop();
        self.forget();
        self.list.textContent = "";
        self.answers = {};
        self.ratingUrls = {};
        self.setState("idle");
        self.welcome();
        self.setStatusLine(self.strings.deleted);
        self.input.focus();
      }, function (error) {
        self.setStatusLine(error.message, true);
      }).then(function () { self.deleteButton.disabled = false; });
    }

    // -- storage: the conversation (and running turn) survive a reload in this tab ------------

    save(turn) {
      this.deleteButton.hidden = !this.conversationId;
      try {
        sessionStorage.setItem(this.storageKey, JSON.stringify({
          conversation: this.conversationId, turn: turn ? turn.id : null, since: turn ? turn.since : null }));
      } catch (e) { /* storage disabled: the conversation just does not survive a reload */ }
    }

    load() {
      try { return JSON.parse(sessionStorage.getItem(this.storageKey)) || {}; } catch (e) { return {}; }
    }

    // -- conversation and turns --------------------------------------------------------------

    restore() {
      var self = this, saved = this.load();
      if (!saved.conversation) { this.welcome(); return; }
      this.conversationId = saved.conversation;
      this.deleteButton.hidden = false;
      this.client.request("GET", this.apiUrl + saved.conversation + "/").then(function (data) {
        // Each ended turn's sentence goes back under its last message, where it stood before the reload.
        var endings = data.endings || {}, messages = data.messages;
        messages.forEach(function (m, i) {
          self.draw(m, m.turn);
          var next = messages[i + 1], ended = endings[m.turn];
          if (ended && (!next || next.turn !== m.turn)) {
            self.settle();
            var sentence = self.ending(ended);
            if (sentence) { self.notice(sentence); }
          }
        });
        var active = data.active_turn, ratings = data.ratings || {}, urls = data.rating_urls || {};
        Object.keys(self.answers).forEach(function (id) {
          if (!active || id !== String(active.id)) { self.rateable(id, ratings[id], urls[id]); }
        });
        if (active) { self.follow(active, active.id === saved.turn && saved.since ? saved.since : Date.now()); }
        else { self.save(null); }
        self.handoff.resume(data.handoff, true);
      }).catch(function (error) {
        if (error.status === 404 || error.status === 403) { self.forget(); }
      });
    }

    /* A new conversation: the assistant's greeting, and its suggested questions as buttons that
     * send themselves (gone once a message is sent). */
    welcome() {
      var self = this;
      if (this.greeting) { this.add(el("li", "cvw-msg cvw-msg-assistant cvw-greeting", this.greeting)); }
      if (!this.suggestions.length) { return; }
      var item = this.suggestionsItem = el("li", "cvw-msg cvw-suggestions");
      this.suggestions.forEach(function (question) {
        var button = el("button", "cvw-suggestion", question);
        button.type = "button";
        button.addEventListener("click", function () { self.input.value = question; self.submit(); });
        item.appendChild(button);
      });
      this.add(item);
    }

    forget() {
      this.conversationId = null;
      this.deleteButton.hidden = true;
      try { sessionStorage.removeItem(this.storageKey); } catch (e) { /* nothing kept */ }
    }

    ensureConversation() {
      var self = this;
      if (this.conversationId) { return Promise.resolve(this.conversationId); }
      return this.client.request("POST", this.apiUrl, this.assistant ? { assistant: this.assistant } : {}).then(function (data) {
        self.conversationId = data.id;
        self.save(null);
        return data.id;
      });
    }

    submit() {
      var self = this, content = this.input.value.trim();
      if (!content) { return; }
      if (STATUSES[this.status]) { this.setStatusLine(this.strings.busy); return; }
      if (this.suggestionsItem) { this.suggestionsItem.remove(); this.suggestionsItem = null; }
      // The Send button is about to be disabled: keep focus where the next message is typed.
      if (this.focused() === this.sendButton) { this.input.focus(); }
      this.setState("sending");
      this.setStatusLine("");
      // The same text sent again after a failure reuses its key: if the first POST did reach the
      // server, the API answers with that turn instead of starting a second one.
      var unsent = this.unsent && this.unsent.content === content ? this.unsent :
        { content: content, key: "cvw-" + Date.now().toString(36) + "-" + Math.random().toString(36).slice(2) };
      var key = unsent.key;
      // Shown at once; it stands for the saved message when the turn's state arrives.
      var pending = this.bubble("user", content);
      pending.classList.add("cvw-pending");
      this.input.value = "";
      var post = function (retry) {
        return self.ensureConversation().then(function (id) {
          return self.client.request("POST", self.apiUrl + id + "/turns/", { content: content }, { "Idempotency-Key": key });
        }).catch(function (error) {
          // The kept conversation is gone (session expired): start a new one, once.
          if (error.status === 404 && retry) { self.forget(); return post(false); }
          throw error;
        });
      };
      post(true).then(function (turn) {
        self.unsent = null;
        if (turn.handoff) { self.setState("idle"); self.handoff.kept(turn, pending); return; } // kept for staff: no turn
        pending.classList.remove("cvw-pending");
        self.follow(turn, Date.now(), pending);
      }).catch(function (error) {
        // Nothing the visitor wrote is lost: the text goes back into the box, with the reason.
        self.unsent = unsent;
        self.stopWanted = false;
        pending.remove();
        if (!self.input.value) { self.input.value = content; }
        self.setState("idle");
        self.setStatusLine(error.message, true);
        self.announce(error.message);
        self.input.focus();
      });
    }

    /* Follow the turn `summary` (the API's 202 or a restored active turn) until it ends.
     * `pending` is the visitor's message already shown for it, if any. */
    follow(summary, since, pending) {
      var turn = this.poller.follow(summary, since, { pending: pending || null });
      this.save(turn);
      this.setState("waiting");
      this.setStatusLine(this.strings.thinking);
      this.poller.schedule(FIRST_DELAY);
      if (this.stopWanted) { this.stopWanted = false; this.cancel(); }
    }

    /* A new state of the followed turn landed: draw it. Returns whether an answer is still streamed. */
    changed(turn, state) {
      var self = this, streaming = false;
      (state.messages || []).forEach(function (m) { streaming = self.draw(m, turn.id); });
      this.askApproval(turn, turn.approvals);
      if (!state.done && state.status === "running" && this.status === "waiting") { this.setState("running"); }
      return streaming;
    }

    looked(turn, recovered) {
      // A problem shown (Stop refused) stays until the visitor acts; "reconnecting" goes once a look lands.
      if (recovered || !this.statusLine.classList.contains("cvw-status-problem")) {
        this.setStatusLine(this.progress(turn));
      }
    }

    /* The tool calls `turn` waits for a person to approve, each drawn once as text (its summary
     * and its exact arguments; never HTML), with Approve / Decline when the visitor may decide it.
     * The answer names the call id and the arguments' hash the state gave: the server decides. */
    askApproval(turn, approvals) {
      var self = this, s = this.strings, shown = this.approvalItems || (this.approvalItems = {});
      var wanted = {};
      approvals.forEach(function (a) {
        var key = turn.id + ":" + a.call_id;
        wanted[key] = true;
        if (shown[key]) { return; }
        var item = shown[key] = el("li", "cvw-msg cvw-approval");
        item.setAttribute("data-call", a.call_id);
        item.appendChild(el("p", "cvw-approval-ask", a.approver === "staff" ? s.approval_staff : s.approval_needed));
        item.appendChild(el("p", "cvw-approval-summary", a.summary));
        var details = el("details", "cvw-approval-details");
        details.appendChild(el("summary", "", s.approval_details));
        details.appendChild(el("pre", "cvw-approval-arguments", a.arguments));
        item.appendChild(details);
        if (a.approver !== "staff") {
          var actions = el("div", "cvw-approval-actions");
          [["approve", s.approve], ["decline", s.decline]].forEach(function (choice) {
            var button = el("button", "cvw-approval-" + choice[0], choice[1]);
            button.type = "button";
            button.addEventListener("click", function () { self.decide(turn, a, choice[0], item); });
            actions.appendChild(button);
          });
          item.appendChild(actions);
        }
        self.add(item);
      });
      Object.keys(shown).forEach(function (key) {
        if (!wanted[key]) { shown[key].remove(); delete shown[key]; }
      });
    }

    decide(turn, approval, decision, item) {
      var self = this;
      var buttons = item.querySelectorAll("button");
      buttons.forEach(function (b) { b.disabled = true; });
      this.client.request("POST", turn.approvalUrl, { call_id: approval.call_id, decision: decision,
                                                      arguments_sha256: approval.arguments_sha256 }).then(function () {
        self.poller.hurry(turn);
      }, function (error) {
        buttons.forEach(function (b) { b.disabled = false; });
        self.setStatusLine(error.message, true);
        self.poller.hurry(turn);
      });
    }

    /* The status line while `turn` is followed: what the visitor is waiting for now. */
    progress(turn) {
      var s = this.strings;
      if (this.status === "stopping") { return s.stopping; }
      if (turn.approvals && turn.approvals.length) { return s.approval_waiting; }
      if (turn.resuming) { return s.resuming; }
      if (turn.streaming) { return s.writing; }
      if (this.status === "waiting" && Date.now() - turn.since >= QUEUED_NOTICE) { return s.waiting; }
      return s.thinking;
    }

    /* The sentence under a turn that ended `state.status` (with `state.error`), or "" for none:
     * the same whether the widget saw it end or draws it again from the transcript. */
    ending(state) {
      var s = this.strings;
      var endings = { cancelled: s.stopped, failed: state.error || s.failed, incomplete: state.error || s.incomplete,
                      timeout: s.timed_out, gone: state.error || s.gone };
      return endings[state.status] || state.error || "";
    }

    end(turn, state) {
      this.save(null);
      var ending = this.ending(state);
      if (state.status === "gone") { this.forget(); }
      if (ending) { this.notice(ending); }
      this.settle(); // a streamed message the turn ended in the middle of keeps the text shown
      if (state.status !== "gone") { this.rateable(turn.id, null, turn.ratingUrl); } // any ended turn with an answer, as after a reload
      var answer = null, handedOver = false;
      (state.messages || []).forEach(function (m) {
        if (m.role === "assistant" && m.content) { answer = m.content; }
        if (m.role === "tool" && m.name === "hand_to_person" && !m.is_error) { handedOver = true; }
      });
      if (handedOver) { this.handoff.resume("waiting"); } // the assistant handed the conversation to a person
      this.announce([answer && state.status === "completed" ? answer : "", ending || ""].join(" ").trim());
      var hadFocus = !!this.focused() && this.focused() !== this.launcher;
      this.setState("ended");
      this.setStatusLine("");
      if (hadFocus) { this.input.focus(); }
    }

    cancel() {
      var self = this, turn = this.turn, before = this.status;
      if (!STATUSES[before] || before === "stopping") { return; }
      this.setState("stopping");
      this.setStatusLine(this.strings.stopping);
      if (!turn) { this.stopWanted = true; return; } // still being posted: stopped once accepted (follow)
      this.client.request("POST", turn.cancelUrl, {}).then(function () {
        // Look at once rather than after the current back-off: the turn may already be over.
        self.poller.hurry(turn);
      }, function (error) {
        if (self.turn !== turn) { return; }
        self.setState(before);
        self.setStatusLine(error.message, true);
      });
    }

    // -- drawing ------------------------------------------------------------------------------

    /* Add an item to the end of the log and bring it into view. */
    add(item) {
      this.list.appendChild(item);
      this.log.scrollTop = this.log.scrollHeight;
      return item;
    }

    bubble(role, text) {
      var item = el("li", "cvw-msg cvw-msg-" + role);
      if (role === "assistant") { renderMarkdown(text, item); } else { item.textContent = text; }
      return this.add(item);
    }

    /* Draw one message of the transcript (once per id); `turnId` scopes its tool call ids.
     * Returns whether it is an assistant message still being streamed. */
    draw(message, turnId) {
      var self = this, key = "m" + message.id;
      if (message.role === "assistant" && message.streaming) { this.grow(message.content || ""); return true; }
      if (this.nodes[key]) { return false; }
      this.nodes[key] = true;
      if (message.role === "user") {
        var turn = this.turn;
        if (turn && turn.pending && turnId === turn.id) { turn.pending = null; return false; } // already shown
        if (!turnId && this.handoff.adopt(message)) { return false; } // kept for staff, shown while it was posted
        this.bubble("user", message.content);
      } else if (message.role === "assistant") {
        // The finished message takes the place of its streamed one, reusing its element.
        if (message.content) { this.grow(message.content); this.answers[turnId] = this.growing; }
        this.settle();
        if (message.content && !(message.tool_calls || []).length) {
          var sources = this.sources.item(turnId, this.strings.sources);
          if (sources) { this.add(sources); }
        }
        (message.tool_calls || []).forEach(function (call) {
          var args = Object.keys(call.arguments || {}).map(function (k) { return String(call.arguments[k]); });
          var name = call.name + (args.length ? " (" + compact(args.join(", ")) + ")" : "");
          self.nodes["c" + turnId + call.id] = self.add(el("li", "cvw-msg cvw-step", fmt(self.strings.using_tool, { name: name })));
        });
      } else if (message.role === "tool") {
        this.sources.collect(message, turnId);
        var step = this.nodes["c" + turnId + message.tool_call_id] || this.add(el("li", "cvw-msg cvw-step"));
        var text = fmt(message.is_error ? this.strings.tool_failed : this.strings.tool_result,
                       { name: message.name || "", result: compact(message.content) });
        step.appendChild(el("span", "cvw-result" + (message.is_error ? " cvw-result-error" : ""), text));
        step.classList.add("cvw-step-done");
        this.log.scrollTop = this.log.scrollHeight;
      } else if (message.role === "staff") {
        this.add(this.handoff.bubble(message));
      }
      return false;
    }

    /* Show `text` as the assistant message being written, in place: the element is made once and
     * patched as the text grows. A reader who scrolled up to read stays where they are. */
    grow(text) {
      var log = this.log, item = this.growing;
      if (!item) {
        item = this.growing = this.add(el("li", "cvw-msg cvw-msg-assistant cvw-growing"));
        item.setAttribute("aria-busy", "true");
      }
      var atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < NEAR_BOTTOM;
      patch(item, text);
      if (atEnd) { log.scrollTop = log.scrollHeight; }
    }

    /* The message being written is finished (or the turn ended): it becomes an ordinary one. */
    settle() {
      var item = this.growing;
      if (!item) { return; }
      this.growing = null;
      item.classList.remove("cvw-growing");
      item.removeAttribute("aria-busy");
    }

    /* The rating control under the answer of the finished turn `turnId`, posting to `url` (the
     * API's rating_url); `saved` is the rating given before a reload ({value, comment}). */
    rateable(turnId, saved, url) {
      var answer = this.answers[turnId], self = this;
      if (!answer || !this.conversationId || !url) { return; }
      var control = new RatingControl({ strings: this.strings, client: this.client, url: this.client.resolve(url),
                                        saved: saved, id: "cvw-comment-" + this.n + "-" + turnId,
                                        maxLength: this.commentMaxLength,
                                        announce: function (text) { self.announce(text); } });
      var atEnd = this.log.scrollHeight - this.log.scrollTop - this.log.clientHeight < NEAR_BOTTOM;
      this.list.insertBefore(control.item, answer.nextSibling);
      if (atEnd) { this.log.scrollTop = this.log.scrollHeight; }
    }

    notice(text) {
      this.add(el("li", "cvw-msg cvw-notice", text));
    }

    announce(text) {
      // Markdown marks are noise when read aloud.
      this.announcer.textContent = text.replace(/```|[*`#]/g, "");
    }

    /* Enter `status` (a key of STATUSES) and set the controls from it. */
    setState(status) {
      var busy = STATUSES[status], stopHadFocus = this.focused() === this.stopButton;
      this.status = status;
      this.sendButton.disabled = busy;
      this.stopButton.hidden = !busy;
      this.log.setAttribute("aria-busy", busy ? "true" : "false");
      this.frame.classList.toggle("cvw-busy", busy);
      if (stopHadFocus && !busy) { this.input.focus(); }
    }

    setStatusLine(text, problem) {
      this.statusLine.textContent = text;
      this.statusLine.classList.toggle("cvw-status-problem", !!problem);
    }
  }

  function attach(host) {
    if (!host.conversationsWidget) { host.conversationsWidget = new Widget(host); }
  }

  /* Start the widget of every host element on the page that has none yet. */
  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("conversations-widget, [data-conversations-widget]"), attach);
  }

  // <conversations-widget> starts itself whenever it is put in a page, now or later, and stops
  // polling when it is taken out (a single-page app that swaps views, a test that removes it).
  class ConversationsWidgetElement extends HTMLElement {
    connectedCallback() {
      if (this.conversationsWidget) { this.conversationsWidget.reconnect(); } else { attach(this); }
    }

    disconnectedCallback() {
      if (this.conversationsWidget) { this.conversationsWidget.disconnect(); }
    }
  }

  if (window.customElements && !customElements.get("conversations-widget")) {
    customElements.define("conversations-widget", ConversationsWidgetElement);
  }
  window.ConversationsWidget = { start: start, renderMarkdown: renderMarkdown };
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
