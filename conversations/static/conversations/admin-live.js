/* The staff pages of conversations handed to a person, live (admin/handoff.py): the inbox and
 * the answer page poll their JSON twin (the element's data-live-url, every data-interval ms,
 * with its ETag) and draw what changed in place. No build step, no library.
 *
 * Nothing a staff member typed is touched: the reply box is never drawn again, only made
 * read-only when they may no longer reply. Text from visitors and staff reaches the inbox
 * through textContent; the answer page inserts the HTML its server drew with the page's own
 * (autoescaping) templates. */
(function () {
  "use strict";

  var MAX_RETRY_DELAY = 10000;  // ms: a server that does not answer is asked less and less often

  function strings() {
    var node = document.getElementById("handoff-live-strings");
    return node ? JSON.parse(node.textContent) : {};
  }

  function fmt(text, values) {
    return text.replace(/%\((\w+)\)s/g, function (all, key) { return key in values ? values[key] : all; });
  }

  /* Polls `url` every `interval` ms while the tab is shown (once at once when it is shown again),
   * `changed(data)` for each new content. */
  function poll(url, interval, changed, status, s) {
    var etag = null, timer = null, busy = false, delay = interval;
    function schedule() {
      if (!timer && !document.hidden) { timer = setTimeout(function () { timer = null; look(); }, delay); }
    }
    function look() {
      if (busy || document.hidden) { return; }
      busy = true;
      var headers = { "Accept": "application/json" };
      if (etag) { headers["If-None-Match"] = etag; }
      fetch(url(), { credentials: "same-origin", cache: "no-store", headers: headers }).then(function (response) {
        if (response.status === 304) { return null; }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        etag = response.headers.get("ETag");
        return response.json();
      }).then(function (data) {
        busy = false;
        delay = interval;
        if (status.dataset.offline) { status.textContent = ""; delete status.dataset.offline; }
        if (data) { changed(data); }
        schedule();
      }).catch(function () {
        busy = false;
        delay = Math.min(delay * 2, MAX_RETRY_DELAY);
        status.textContent = s.offline;
        status.dataset.offline = "1";
        schedule();
      });
    }
    document.addEventListener("visibilitychange", function () {
      if (document.hidden && timer) { clearTimeout(timer); timer = null; } else if (!document.hidden) { look(); }
    });
    schedule();
  }

  // -- the inbox ------------------------------------------------------------------------------

  var CELLS = ["waited", "assistant", "state", "taken_by", "last_words"];
  var LINKED = { waited: true, last_words: true };

  function rowKey(tr) {
    var link = tr.querySelector("a[href]");
    return link ? link.getAttribute("href") : "";
  }

  function newRow(row) {
    var tr = document.createElement("tr");
    CELLS.forEach(function (name, i) {
      var cell = document.createElement(i === 0 ? "th" : "td");
      cell.className = "field-" + name;
      if (LINKED[name]) { var a = document.createElement("a"); a.href = row.url; cell.appendChild(a); }
      tr.appendChild(cell);
    });
    return tr;
  }

  function fillRow(tr, row) {
    CELLS.forEach(function (name) {
      var cell = tr.querySelector(".field-" + name), target = cell.querySelector("a") || cell;
      if (target.textContent !== row[name]) { target.textContent = row[name]; }
    });
    tr.classList.toggle("handoff-unanswered", row.unanswered);
  }

  /* A short tone, where the staff member asked for one (and the browser allows sound). */
  function sound() {
    var box = document.getElementById("handoff-sound"), context = null;
    if (!box) { return function () {}; }
    var Context = window.AudioContext || window.webkitAudioContext;
    box.checked = window.localStorage.getItem("conversations-handoff-sound") === "1";
    function ready() { if (!context && Context) { context = new Context(); } }
    box.addEventListener("change", function () {
      window.localStorage.setItem("conversations-handoff-sound", box.checked ? "1" : "0");
      if (box.checked) { ready(); }
    });
    // A browser lets a page play sound only after a gesture: the first one on the page will do.
    document.addEventListener("pointerdown", function () { if (box.checked) { ready(); } }, { once: true });
    return function () {
      if (!box.checked || !context) { return; }
      var tone = context.createOscillator(), gain = context.createGain();
      tone.frequency.value = 880;
      gain.gain.value = 0.1;
      tone.connect(gain);
      gain.connect(context.destination);
      tone.start();
      tone.stop(context.currentTime + 0.25);
    };
  }

  function inbox(root, s) {
    var body = document.querySelector("#result_list tbody"), status = root.querySelector(".handoff-live-status");
    var title = document.title, seen = {}, ring = sound(), waiting = null;
    Array.prototype.forEach.call(body.rows, function (tr) { seen[rowKey(tr)] = true; });
    poll(function () { return root.dataset.liveUrl; }, +root.dataset.interval, function (data) {
      var rows = {}, fresh = 0;
      Array.prototype.forEach.call(body.rows, function (tr) { rows[rowKey(tr)] = tr; });
      data.rows.forEach(function (row, i) {
        var tr = rows[row.url] || newRow(row);
        delete rows[row.url];
        fillRow(tr, row);
        // Moved only when out of place: a row moved is taken out of the page, and loses the focus.
        if (body.rows[i] !== tr) { body.insertBefore(tr, body.rows[i] || null); }
        if (!seen[row.url]) { seen[row.url] = true; if (row.unanswered) { fresh += 1; } }
      });
      Object.keys(rows).forEach(function (key) { rows[key].remove(); });
      document.title = data.waiting ? fmt(s.waiting_title, { count: data.waiting }) + " " + title : title;
      var count = document.querySelector("#changelist .paginator");
      if (count && !count.querySelector("a")) { count.textContent = data.count_text; }
      // A new request past the first page (the longest waits fill it) shows in the count alone.
      if (fresh || (waiting !== null && data.waiting > waiting)) { status.textContent = s.new_request; ring(); }
      waiting = data.waiting;
    }, status, s);
  }

  // -- the answer page ------------------------------------------------------------------------

  function answer(root, s) {
    var entries = document.getElementById("transcript-entries"), state = document.getElementById("handoff-status");
    var form = document.getElementById("handoff-form"), box = document.getElementById("handoff-content");
    var status = root.querySelector(".handoff-live-status");
    function url() { return root.dataset.liveUrl + "?after=" + encodeURIComponent(root.dataset.after); }
    poll(url, +root.dataset.interval, function (data) {
      var wrote = false;
      data.entries.forEach(function (entry) {
        if (entries.querySelector('[data-id="' + entry.id + '"]')) { return; }
        var holder = document.createElement("div");
        holder.innerHTML = entry.html; // the server's template, autoescaped: no text of anyone's is markup here
        entries.appendChild(holder.firstElementChild);
        root.dataset.after = Math.max(+root.dataset.after, entry.id);
        wrote = true;
      });
      if (wrote) {
        var empty = document.querySelector(".transcript-empty");
        if (empty) { empty.remove(); }
        status.textContent = s.new_message;
      }
      state.innerHTML = data.status_html;
      form.hidden = !data.held && !box.value;
      box.readOnly = !data.can_reply;
      if (data.can_reply) { box.removeAttribute("aria-disabled"); } else { box.setAttribute("aria-disabled", "true"); }
      form.querySelector("[name=holder]").value = data.holder_id === null ? "" : data.holder_id;
      form.querySelectorAll("button[data-when]").forEach(function (button) {
        button.hidden = !data[button.dataset.when];
      });
    }, status, s);
  }

  function start() {
    var root = document.querySelector("[data-live-page]");
    if (!root) { return; }
    (root.dataset.livePage === "inbox" ? inbox : answer)(root, strings());
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
