// The answer page. Everything an asker wrote arrives as JSON strings and goes into the page
// with textContent; only `detailHtml` (markdown rendered and sanitised by the server) is
// inserted as HTML. No inline script: the page runs under a strict Content-Security-Policy.
// The server made every shown text inert (control characters, bidi overrides as escapes): a label
// is shown as its `text` and sent back as its `label`, the bytes the asker wrote.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const state = {
    csrf: null, user: null, namespaces: [], source: null, statuses: new Map(), connected: false, skewMs: 0, cards: new Map(), view: "pending", notify: false,
    readonly: new Map(),
    redisRun: null,  // the run of the server's Redis when this page signed in (sessionEndedMessage)
    // By namespace: how many cards it has for this person in all (total) and the API cursor after the
    // last one this page loaded in order; the page holds a window of them, not all (issue 27).
    more: new Map(), window: 100,
    // A snapshot's cards past the first screenful, added once that screenful is painted (paintRest).
    unpainted: [],
  };
  const FIRST_PAINT = 10;  // about a screenful: the first card shows without waiting for the other 90 to be built
  const RECOMMENDED = /\s*\(recommended\)\s*$/i;
  const OFFLINE = "Could not reach the server, so nothing was sent. Your answer is kept here: send it again when the connection is back.";
  const CHAT_HINT = "Dismisses this question (the agent is told it was cancelled) so you can reply in the agent's own chat.";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  // -- talking to the server -------------------------------------------------------------

  async function call(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    if (state.csrf) headers["X-CSRF-Token"] = state.csrf;
    let response;
    try {
      response = await fetch(path, {
        method, headers, credentials: "same-origin", body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      const error = new Error(OFFLINE);
      error.code = "OFFLINE";
      throw error;
    }
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const error = new Error((data && data.message) || response.statusText || "the server refused");
      error.code = (data && data.code) || String(response.status);
      error.status = response.status;
      error.winner = data && data.winner;
      if (response.status === 429) error.retryAfter = response.headers.get("Retry-After");
      throw error;
    }
    return data;
  }

  async function boot() {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    $("show-pending").addEventListener("click", () => showView("pending"));
    $("show-history").addEventListener("click", () => showView("history"));
    $("show-remembered").addEventListener("click", () => showView("remembered"));
    $("notify").addEventListener("click", toggleNotify);
    for (const name of FILTERS) $("filter-" + name).addEventListener("change", applyFilters);
    $("filter-clear").addEventListener("click", clearFilters);
    $("show-more").addEventListener("click", showMore);
    document.addEventListener("keydown", onKey);
    setInterval(refreshTimes, 10000);
    state.notify = localStorage.getItem("qb-notify") === "on" && "Notification" in window && Notification.permission === "granted";
    try {
      start(await call("GET", "/api/session"));
    } catch (error) {
      showSignIn(error.code === "BROKER_UNAVAILABLE" ? "The server is up, but its Redis does not answer; reload in a moment." : "");
    }
  }

  function showSignIn(message) {
    if (state.source) state.source.close();
    state.source = null;
    state.csrf = null;
    $("banner").hidden = true;  // signed out, nothing is paused or reconnecting: the sign-in form says it all
    $("main").hidden = true;
    $("views").hidden = true;
    $("notify").hidden = true;
    $("sign-out").hidden = true;
    $("who").textContent = "";
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = message || "";
    updateTitle();
  }

  async function signIn(event) {
    event.preventDefault();
    const token = $("token").value;
    const body = token ? { token } : { user: $("user").value, password: $("password").value };
    const missing = token ? "" : signInMissing(body.user.trim(), body.password);
    if (missing) {  // said here, as the server would: no attempt spent on it
      $("sign-in-error").textContent = missing;
      $(body.user.trim() ? "password" : "user").focus();
      return;
    }
    $("sign-in-button").disabled = true;
    try {
      start(await call("POST", "/api/session", body));
      $("password").value = "";
      $("token").value = "";
    } catch (error) {
      $("sign-in-error").textContent = error.code === "TOO_MANY_ATTEMPTS"
        ? "Too many failed sign-ins. Try again in " + (error.retryAfter || "a few") + " seconds."
        : error.message;
    } finally {
      $("sign-in-button").disabled = false;
    }
  }

  function signInMissing(user, password) {
    if (!user && !password) return "Type your user name and password.";
    if (!password) return "Type your password.";
    return user ? "" : "Type your user name.";
  }

  async function signOut() {
    try { await call("DELETE", "/api/session"); } catch (e) { /* signed out here anyway */ }
    state.more.clear();
    state.unpainted = [];
    for (const id of [...state.cards.keys()]) dropCard(id);
    showSignIn();
  }

  function start(session) {
    state.csrf = session.csrf;
    state.user = session.user;
    state.namespaces = session.namespaces || [session.namespace];
    state.statuses = new Map();
    $("who").textContent = session.user;
    $("who").title = "signed in as " + session.user;
    $("namespace").textContent = state.namespaces.join(", ");
    $("namespace").title = (state.namespaces.length === 1 ? "namespace " : "namespaces ") + state.namespaces.join(", ");
    $("sign-in").hidden = true;
    $("main").hidden = false;
    $("views").hidden = false;
    $("sign-out").hidden = false;
    $("notify").hidden = !("Notification" in window);
    renderNotify();
    connect(session);
    redisRun().then((run) => { state.redisRun = run; });
  }

  // Which run of the server's Redis answers (new at every Redis start; null when unknown), from /healthz.
  async function redisRun() {
    try {
      const response = await fetch("/healthz", { credentials: "same-origin", cache: "no-store" });
      const run = (await response.json()).redisRun;
      return typeof run === "string" ? run : null;
    } catch (e) { return null; }
  }

  // A session gone: revoked, or lost with the server's data: a Redis that restarted since this page signed in
  // and kept no session started empty (no persistence), so every page must sign in again and its history is gone.
  async function sessionEndedMessage() {
    const run = await redisRun();
    return run !== null && typeof state.redisRun === "string" && run !== state.redisRun
      ? "The server's Redis restarted and lost its data (your session with it); sign in again."
      : "Your session ended; sign in again.";
  }

  function connect(session) {
    const source = new EventSource("/api/events");
    state.source = source;
    // Whatever the stream says next, the snapshot's cards are all on the page first: events keep their order.
    const on = (name, handle) => source.addEventListener(name, (e) => { paintRest(); return handle(e); });
    on("snapshot", (e) => onSnapshot(JSON.parse(e.data)));
    on("status", (e) => onStatus(JSON.parse(e.data)));
    on("added", (e) => {
      const event = JSON.parse(e.data);
      setTotal(event);
      addCard(event.request);
      announce(event.request);
    });
    on("addedMany", (e) => {
      // several cards at once (a failover's backlog): one notification, for the first
      const event = JSON.parse(e.data);
      setTotal(event);
      for (const request of event.requests) addCard(request);
      if (event.requests.length) announce(event.requests[0]);
      fetchPassed(event);
    });
    // A card beyond the window: only counted ("N more waiting"), fetched when the page gets there.
    on("waiting", (e) => {
      const event = JSON.parse(e.data);
      setTotal(event);
      renderEmpty();
      announce(null);
      fetchPassed(event);
    });
    on("removed", (e) => onRemoved(JSON.parse(e.data)));
    on("updated", (e) => onUpdated(JSON.parse(e.data)));
    on("readonly", (e) => onReadonly(JSON.parse(e.data)));
    // The server is stopping on purpose (SIGTERM: a demo that ended, an operator): the stream ends next,
    // and the browser keeps retrying; the banner says it stopped, calmly, until a snapshot says it is back.
    on("stopping", () => { state.stopped = true; renderBanner(); });
    on("error", async () => {
      if (state.source !== source) return;
      setConnected(false);
      probeServer();
      if (source.readyState !== EventSource.CLOSED) return;  // the browser retries by itself
      // Closed for good (the server answered with an error): is the session still valid?
      setTimeout(async () => {
        if (state.source !== source) return;
        try { await call("GET", "/api/session"); connect(session); }
        catch (error) {
          if (error.code === "UNAUTHENTICATED") showSignIn(await sessionEndedMessage());
          else {
            if (error.code === "BROKER_UNAVAILABLE") { state.serverUp = true; state.redisDown = true; renderBanner(); }
            connect(session);
          }
        }
      }, 2000);
    });
  }

  // The stream broke: is the server gone, or is it up without its Redis? The banner says which.
  async function probeServer() {
    let health = null;
    try {
      const response = await fetch("/healthz", { credentials: "same-origin", cache: "no-store" });
      health = await response.json();
    } catch (e) { health = null; }
    if (state.connected) return;
    state.serverUp = health !== null;
    state.redisDown = Boolean(health && health.redis === "down");
    renderBanner();
  }

  // -- connection and provider status ------------------------------------------------------

  function setConnected(connected) {
    state.connected = connected;
    document.body.dataset.connected = connected ? "yes" : "no";
    renderBanner();
    for (const card of state.cards.values()) arm(card);
  }

  function redisOf(namespace) {
    const status = state.statuses.get(namespace);
    return status && status.redis === "down" ? "down" : "ok";
  }

  function statusOf(namespace) {
    const status = state.statuses.get(namespace);
    return status ? status.status : "connecting";
  }

  function standbyLine(status) {
    const line = el("span", {}, "Standing by: " + (status.holder || "another server") + " is serving " +
      (state.namespaces.length > 1 ? status.namespace : "this namespace") + ", so its questions are answered there");
    const url = /^https?:\/\//i.test(status.holderUrl || "") ? status.holderUrl : "";
    if (url) line.append(" at ", el("a", { href: url, class: "holder-link", id: state.namespaces.length > 1 ? null : "holder-link", text: url }));
    const holder = status.holder || "the active provider";
    if (status.takeoverBy && status.takeoverLate) {
      line.append(el("span", { class: "takeover-late", role: "alert", text: ". " + holder + " has not handed over " +
        status.takeoverWithinS + " s after " + status.takeoverBy + " asked: it still holds the lease, so it runs but " +
        "does not let go (an older version, or a provider that does not hand over). To take over now, stop it: " +
        "Ctrl-C at its terminal (or SIGTERM) releases the lease at once, and this page takes over. " }));
      line.append(el("button", { type: "button", class: "take-over", text: "Ask again",
        title: "Ask " + holder + " again to hand the lease to this server",
        onclick: (event) => takeOver(event.currentTarget, status.namespace) }));
      return line;
    }
    if (status.takeoverBy) {
      line.append(el("span", { class: "takeover-waiting", text: ". " + status.takeoverBy + " asked it to hand over: " +
        "waiting for " + holder + ", which hands over within " + status.takeoverWithinS + " s (a question open there " +
        "gets " + status.takeoverGraceS + " s to be finished, then comes here unanswered), and the questions become " +
        "answerable here." }));
      return line;
    }
    line.append(". Its pending questions are listed below, read-only. ");
    line.append(el("button", { type: "button", class: "take-over", text: "Take over",
      title: "Ask " + (status.holder || "the active provider") + " to hand the lease to this server; it finishes what it is doing first",
      onclick: (event) => takeOver(event.currentTarget, status.namespace) }));
    return line;
  }

  async function takeOver(button, namespace) {
    button.disabled = true;
    try { await call("POST", "/api/takeover", { namespace }); }
    catch (error) { button.disabled = false; button.after(el("span", { class: "error", role: "alert", text: " " + error.message })); }
  }

  // -- the holder's questions, read-only, while another provider serves ----------------------

  function onReadonly(event) {
    state.readonly.set(event.namespace, event.requests || []);
    renderReadonly();
  }

  function renderReadonly() {
    const section = $("readonly");
    const list = $("readonly-list");
    list.replaceChildren();
    for (const [namespace, requests] of state.readonly) {
      if (statusOf(namespace) !== "standby") continue;
      for (const request of requests) {
        const meta = [request.agent || "an agent"];
        if (request.priority && request.priority !== "normal") meta.unshift(request.priority.toUpperCase());
        if (state.namespaces.length > 1) meta.push(namespace);
        if (request.createdMs) meta.push("waiting " + ago(request.createdMs));
        const item = el("li", { class: "readonly-request" }, el("div", { class: "meta muted small", text: meta.join(" · ") }));
        for (const question of request.questions) {
          const text = el("div", { class: "readonly-question" }, el("strong", { text: question.question }));
          if (question.options && question.options.length) text.append(el("span", { class: "muted", text: " — " + question.options.join(" / ") }));
          item.append(text);
        }
        list.append(item);
      }
    }
    section.hidden = list.childNodes.length === 0;
    $("readonly-count").textContent = "(" + list.childNodes.length + ")";
    renderEmpty();
  }

  function ago(createdMs) {
    const seconds = Math.max(0, Math.round((Date.now() + state.skewMs - createdMs) / 1000));
    return seconds < 90 ? seconds + " s" : seconds < 5400 ? Math.round(seconds / 60) + " min" : Math.round(seconds / 3600) + " h";
  }

  function renderBanner() {
    const banner = $("banner");
    if (!state.csrf) return;  // signed out: a late probe of the stream that ended must not bring a banner back
    banner.replaceChildren();
    let bad = false;
    const redisDown = state.connected ? state.namespaces.some((n) => redisOf(n) === "down") : state.serverUp && state.redisDown;
    if (redisDown) {
      bad = true;
      banner.append("The server is up, but its Redis (the broker's store) does not answer; waiting for it… Sending is paused, and what you typed stays here.");
    } else if (!state.connected && state.stopped) {
      banner.append("The server was stopped on purpose (a demo that finished, or whoever runs it stopped it). " +
        "This page reconnects by itself when it runs again; what you typed stays here.");
    } else if (!state.connected) {
      bad = true;
      banner.append(state.serverUp
        ? "Reconnecting to the server… Sending is paused, and what you typed stays here."
        : "Disconnected from the server; reconnecting… Sending is paused, and what you typed stays here.");
    } else if (!state.namespaces.length) {
      bad = true;
      banner.append("You may not answer in any namespace this server serves; ask an operator to add you in [namespaces] of its users file.");
    } else {
      for (const namespace of state.namespaces) {
        const status = state.statuses.get(namespace) || { status: "connecting", namespace };
        const prefix = state.namespaces.length > 1 && status.status !== "standby" ? namespace + ": " : "";
        if (status.status === "active") continue;
        if (status.status !== "standby") bad = true;
        const line = status.status === "standby" ? standbyLine(status)
          : el("span", { text: prefix + (status.status === "stopped" ? "This server is stopping." : "Connecting to the broker…") });
        banner.append(el("div", {}, line));
      }
    }
    banner.hidden = !banner.childNodes.length;
    banner.className = bad ? "bad" : "";
    renderEmpty();
  }

  function onSnapshot(snapshot) {
    // One snapshot per namespace (the stream carries every namespace this person may use).
    paintRest();
    state.skewMs = snapshot.nowMs - Date.now();
    state.connected = true;
    state.stopped = false;
    onStatus(snapshot.status);
    onReadonly({ namespace: snapshot.namespace, requests: snapshot.readonly || [] });
    if (snapshot.window) state.window = snapshot.window;
    const total = snapshot.total === undefined ? snapshot.requests.length : snapshot.total;
    // Only the first cards came: one loaded further on may still be pending (the API brings it again).
    const truncated = total > snapshot.requests.length;
    state.more.set(snapshot.namespace, { total, cursor: snapshot.cursor || "0.0", dry: !truncated, fetching: false });
    const live = new Set(snapshot.requests.map((r) => r.id));
    const missing = [...state.cards.values()].filter((card) => card.request.namespace === snapshot.namespace && !live.has(card.id) && !card.closed);
    for (const card of missing) card.unlisted = true;
    if (missing.length) explainGone(missing.map((card) => card.id), truncated);
    state.batching = true;  // one arrange and one filter pass for the lot, not one per card
    try { for (const request of snapshot.requests.slice(0, FIRST_PAINT)) addCard(request); }
    finally { state.batching = false; }
    state.unpainted = snapshot.requests.slice(FIRST_PAINT);
    if (state.unpainted.length) {
      requestAnimationFrame(() => setTimeout(paintRest));  // after the first screenful's frame
      setTimeout(paintRest, 100);  // a tab in the background paints no frame
    }
    arrange();
    renderEmpty();
    setConnected(true);
  }

  function paintRest() {
    if (!state.unpainted.length) return;
    const rest = state.unpainted;
    state.unpainted = [];
    if (!state.csrf) return;  // signed out meanwhile
    state.batching = true;
    try { for (const request of rest) addCard(request); }
    finally { state.batching = false; }
    arrange();
    renderEmpty();
  }

  // The snapshot's cards not on the page yet (paintRest): counted as loaded, so nothing is fetched twice.
  function unpaintedIn(namespace) {
    return state.unpainted.filter((r) => (namespace === null || r.namespace === namespace) && !state.cards.has(r.id)).length;
  }

  // Cards that went while this page was not listening: the history says why, and a note says it.
  // One delivered again while the history was read (a server that had not yet taken the lease when the
  // page reconnected takes it and redelivers) is pending: the history's "not settled" must not close it.
  async function explainGone(ids, truncated) {
    let entries = [];
    try { entries = (await call("GET", "/api/history?limit=200")).entries; } catch (e) { entries = []; }
    for (const id of ids) {
      const entry = entries.find((e) => e.id === id);
      const settled = entry && entry.event === "answered" && !entry.hidden
        ? { answer: { answers: entry.questions.map((q) => ({ id: q.id, selected: q.selected || [], custom: q.custom || undefined })) } } : null;
      const card = state.cards.get(id);
      if (!entry && truncated) continue;  // not in the snapshot's window, not settled: still pending
      if (card && card.unlisted && !card.closed && !card.submitting) closeOrDrop(id, entry ? entry.event : "gone", entry ? entry.by : "", settled);
    }
  }

  function onStatus(status) {
    state.statuses.set(status.namespace, status);
    if (status.status === "standby") {
      // Another server serves the namespace now: what this one lost goes there.
      for (const card of [...state.cards.values()])
        if (card.lost && card.request.namespace === status.namespace) { card.lost = false; closeOrDrop(card.id, "moved", "", null); }
    }
    document.body.dataset.status = [...state.statuses.values()].map((s) => s.status).join(" ");
    renderBanner();
    renderReadonly();
    for (const card of state.cards.values()) arm(card);
  }

  function renderEmpty() {
    const open = openCount();
    const waiting = renderMore();
    const empty = $("empty");
    empty.hidden = open + waiting > 0;
    const standingBy = state.namespaces.length > 0 && state.namespaces.every((n) => statusOf(n) === "standby");
    if (standingBy && !$("readonly").hidden) empty.hidden = true;
    empty.textContent = standingBy
      ? "This server is standing by: pending questions are answered on the active server (see above)."
      : "No pending questions. New ones appear here as agents ask.";
    $("keys-hint").hidden = open === 0;
    $("pending-count").textContent = open + waiting ? "(" + (open + waiting) + ")" : "";
    renderFilters();
    updateTitle();
    refill();
  }

  // -- the window: the first cards on screen, the rest counted and fetched a page at a time ----------

  function loadedIn(namespace) {
    let open = 0;
    for (const card of state.cards.values()) if (!card.closed && card.request.namespace === namespace) open += 1;
    return open + unpaintedIn(namespace);
  }

  function waitingCount() {
    let waiting = 0;
    for (const [namespace, more] of state.more) waiting += Math.max(0, more.total - loadedIn(namespace));
    return waiting;
  }

  function setTotal(event) {
    const namespace = event.namespace || (event.request && event.request.namespace);
    const more = state.more.get(namespace);
    if (!more || event.total === undefined) return;
    more.total = event.total;
    if (event.type === "waiting" || event.total > loadedIn(namespace)) more.dry = false;  // something new after the cursor
  }

  function renderMore() {
    const waiting = state.csrf ? waitingCount() : 0;
    $("more").hidden = waiting === 0;
    $("more-count").textContent = waiting + " more waiting";
    $("show-more").textContent = "Show the next " + Math.min(waiting, state.window);
    return waiting;
  }

  // The next cards after what this page loaded in order, through the API's cursor; true if any came.
  async function fetchMore(namespace, limit) {
    const more = state.more.get(namespace);
    if (!more || more.fetching || !state.csrf) return false;
    more.fetching = true;
    let page = null;
    try {
      const params = new URLSearchParams({ namespace, after: more.cursor, limit: String(Math.max(1, Math.min(1000, limit))) });
      page = await call("GET", "/api/requests?" + params.toString());
    } catch (e) {
      page = null;
    } finally {
      more.fetching = false;
    }
    if (!page || state.more.get(namespace) !== more) return false;  // failed, or a new snapshot started over
    more.cursor = page.cursor;
    more.dry = page.next === null;
    state.batching = true;
    try { for (const request of page.requests) addCard(request); }
    finally { state.batching = false; }
    arrange();
    renderEmpty();
    return page.requests.length > 0;
  }

  // Cards counted while the window was full, placed before this page's cursor (a normal one while it
  // holds low ones): fetching on from the cursor would never bring them, so they are fetched from their
  // place; past a window's worth (a flood of urgent asks) the cursor goes back to them instead, and
  // "Show the next" brings them in order.
  async function fetchPassed(event) {
    const namespace = event.namespace || (event.request && event.request.namespace);
    const more = state.more.get(namespace);
    const place = (cursor) => Number(cursor.split(".")[1]);
    if (!more || event.at === undefined || event.at > place(more.cursor)) return;
    const back = (cursor) => { if (place(cursor) < place(more.cursor)) more.cursor = cursor; more.dry = false; };
    const wanted = event.counted || 1;
    const limit = Math.min(wanted, state.window - (more.passed || 0));
    if (limit <= 0) {
      back("0." + (event.at - 1));
      renderEmpty();
      return;
    }
    more.passed = (more.passed || 0) + limit;
    let page = null;
    try {
      const params = new URLSearchParams({ namespace, after: "0." + (event.at - 1), limit: String(limit) });
      page = await call("GET", "/api/requests?" + params.toString());
    } catch (e) {
      return;
    }
    if (state.more.get(namespace) !== more) return;  // a new snapshot started over
    if (limit < wanted) back(page.cursor);  // the rest stay counted: "Show the next" brings them, in order
    state.batching = true;
    try { for (const request of page.requests) addCard(request); }
    finally { state.batching = false; }
    arrange();
    renderEmpty();
  }

  // Keep the window full as cards are answered or go: the next one is on screen already.
  function refill() {
    if (!state.csrf || state.batching || state.unpainted.length) return;
    for (const [namespace, more] of state.more) {
      const loaded = loadedIn(namespace);
      if (!more.dry && !more.fetching && loaded < state.window && more.total > loaded) fetchMore(namespace, state.window - loaded);
    }
  }

  async function showMore() {
    const button = $("show-more");
    button.disabled = true;
    try {
      for (const [namespace, more] of state.more)
        if (more.total > loadedIn(namespace)) await fetchMore(namespace, state.window);
    } finally {
      button.disabled = false;
    }
  }

  // -- filters over what is loaded ------------------------------------------------------------

  const FILTERS = ["agent", "priority", "kind"];

  function kindOf(request) {
    const kinds = new Set(request.questions.map((q) => q.intent || "question"));
    return kinds.size === 1 ? [...kinds][0] : "question";
  }

  function facets(card) {
    return { agent: card.request.agent || "", priority: card.request.priority || "normal", kind: kindOf(card.request) };
  }

  const KIND_NAMES = { question: "Questions", "plan-review": "Plan reviews" };
  const PRIORITY_NAMES = { urgent: "Urgent", normal: "Normal", low: "Low" };

  function renderFilters() {
    if (state.batching) return;
    const box = $("filters");
    // Every priority, loaded here or not: the cards of one may all be beyond the window.
    const seen = { agent: new Set(), priority: new Set(Object.keys(PRIORITY_NAMES)), kind: new Set() };
    for (const card of state.cards.values()) {
      const f = facets(card);
      for (const name of FILTERS) seen[name].add(f[name]);
    }
    let active = false;
    for (const name of FILTERS) {
      const select = $("filter-" + name);
      const chosen = select.value;
      const values = [...seen[name]].sort((a, b) => name === "priority" ? (LEVELS[a] ?? 1) - (LEVELS[b] ?? 1) : a.localeCompare(b));
      if (chosen && !values.includes(chosen)) values.push(chosen);  // keep a choice whose cards are gone
      const wanted = ["", ...values].join("\n");
      if (select.dataset.values !== wanted) {
        select.dataset.values = wanted;
        const all = { agent: "All agents", priority: "Any priority", kind: "Any kind" }[name];
        select.replaceChildren(el("option", { value: "", text: all }), ...values.map((value) => el("option", { value,
          text: name === "agent" ? (value || "anonymous agent") : name === "priority" ? PRIORITY_NAMES[value] || value : KIND_NAMES[value] || value })));
        select.value = chosen;
      }
      active = active || Boolean(chosen);
    }
    box.hidden = !active && state.cards.size < 2;
    applyFilters();
  }

  function applyFilters() {
    const wanted = Object.fromEntries(FILTERS.map((name) => [name, $("filter-" + name).value]));
    let shown = 0;
    for (const card of state.cards.values()) {
      const f = facets(card);
      const hide = FILTERS.some((name) => wanted[name] && f[name] !== wanted[name]);
      if (card.root.hidden !== hide) card.root.hidden = hide;
      if (!hide) shown += 1;
    }
    const active = FILTERS.some((name) => wanted[name]);
    const waiting = waitingCount();
    $("filter-count").textContent = active ? shown + " of " + state.cards.size + " shown" + (waiting ? " (of those loaded here; " + waiting + " more not loaded)" : "") : "";
    $("filter-clear").hidden = !active;
  }

  function clearFilters() {
    for (const name of FILTERS) $("filter-" + name).value = "";
    renderFilters();
  }

  function openCount() {
    let open = 0;
    for (const card of state.cards.values()) if (!card.closed) open += 1;
    return open + unpaintedIn(null);
  }

  function updateTitle() {
    const open = state.csrf ? openCount() + waitingCount() : 0;
    const where = state.csrf && state.namespaces.length ? " · " + state.namespaces.join(", ") : "";
    document.title = (open ? "(" + open + ") " : "") + "Questions" + where + " · question-broker";
  }

  // -- arrival notice (opt-in) -------------------------------------------------------------

  function renderNotify() {
    const button = $("notify");
    button.textContent = state.notify ? "Notifying" : "Notify";
    button.setAttribute("aria-pressed", state.notify ? "true" : "false");
  }

  async function toggleNotify() {
    if (state.notify) {
      state.notify = false;
      localStorage.setItem("qb-notify", "off");
    } else {
      const permission = await Notification.requestPermission();
      state.notify = permission === "granted";
      localStorage.setItem("qb-notify", state.notify ? "on" : "off");
      if (!state.notify) setBannerNote("Notifications are blocked by the browser for this site.");
      else chime();
    }
    renderNotify();
  }

  function setBannerNote(text) {
    const notes = $("settled-notes");
    const note = el("p", { class: "note", text });
    notes.prepend(note);
    setTimeout(() => note.remove(), 8000);
  }

  // A card beyond the window (null) is not here to quote: the notification says how many wait.
  function announce(request) {
    if (!state.notify || !document.hidden) return;
    const first = request ? request.questions[0] : null;
    try {
      const note = request
        ? new Notification("Question from " + (request.agent || "an agent"), { body: first ? first.question : "", tag: request.id })
        : new Notification("A question arrived", { body: waitingCount() + " more waiting", tag: "qb-waiting" });
      note.onclick = () => { window.focus(); note.close(); };
    } catch (e) { /* some browsers only notify from a service worker */ }
    chime();
  }

  function chime() {
    try {
      const AudioContext = window.AudioContext || window.webkitAudioContext;
      const audio = new AudioContext();
      const tone = audio.createOscillator();
      const gain = audio.createGain();
      tone.frequency.value = 880;
      gain.gain.setValueAtTime(0.08, audio.currentTime);
      gain.gain.exponentialRampToValueAtTime(0.0001, audio.currentTime + 0.25);
      tone.connect(gain).connect(audio.destination);
      tone.start();
      tone.stop(audio.currentTime + 0.25);
    } catch (e) { /* no sound is fine */ }
  }

  // -- settled requests ----------------------------------------------------------------------

  function onUpdated(event) {
    const card = state.cards.get(event.id);
    if (!card) return;
    card.request.askerAway = event.askerAway;
    card.request.awayUntilMs = event.awayUntilMs;
    if (event.askers) card.request.askers = event.askers;
    if (event.priority) card.request.priority = event.priority;
    if (event.quorum) card.request.quorum = event.quorum;
    renderAway(card);
    renderAsking(card);
    renderQuorum(card);
    arrange();
  }

  function renderQuorum(card) {
    // A quorum policy covers the card: how many approvals it needs, who approved, who may still.
    const q = card.request.quorum;
    if (!q) return;
    if (!card.quorum) {
      card.quorum = el("div", { class: "quorum", role: "status" });
      card.root.querySelector(".meta").append(card.quorum);  // in the header: a form's redraw keeps it
    }
    const from = q.groups.length ? " from " + q.groups.join(", ") : "";
    const parts = [el("strong", { text: "Needs " + q.needed + " approvals" + from }),
      el("span", { class: "quorum-approved", text: " · approved by " + (q.approvedBy.length ? q.approvedBy.join(", ") : "nobody yet") })];
    if (q.declinedBy.length) parts.push(el("span", { class: "quorum-declined", text: " · declined by " + q.declinedBy.join(", ") }));
    if (q.mayStill) parts.push(el("span", { class: "quorum-may", text: " · may still: " + (q.mayStill.length ? q.mayStill.join(", ") : "nobody") }));
    if (q.escalatesTo) parts.push(el("span", { class: "quorum-escalation", text: (q.escalated ? " · escalated to " : " · escalates to ") + q.escalatesTo }));
    card.quorum.replaceChildren(...parts);
    card.quorum.title = "Policy " + q.policy + (q.decline === "any" ? ": one decline decides" : ": declines need a quorum too");
  }

  function renderAway(card) {
    const request = card.request;
    card.away.hidden = !request.askerAway;
    if (!request.askerAway) return;
    // The grace is the asker's time to come back: once it ends, housekeeping ends the question.
    if (request.awayUntilMs) {
      const left = request.awayUntilMs - now();
      card.away.textContent = left > 0 ? "asker away · ends in " + span(left) : "asker away · ending now";
      card.away.title = "The asking process stopped. Answer before " + new Date(request.awayUntilMs).toLocaleString() +
        " and the agent gets the answer when it comes back; after that the question ends unless it is back.";
    } else {
      card.away.textContent = "asker away";
    }
  }

  function renderRememberScope(card) {
    // A coalesced card remembers the answer for each of its asking agents.
    const option = card.remember && card.remember.forAgent;
    if (!option) return;
    const agents = (card.request.askers || []).map((a) => a.agent).filter(Boolean);
    option.textContent = agents.length > 1 ? "Remember for each of these " + agents.length + " agents"
      : "Remember for agent " + card.request.agent;
  }

  function renderAsking(card) {
    renderRememberScope(card);
    // A priority other than normal, and every agent whose identical question this card answers.
    const priority = card.request.priority || "normal";
    card.priority.hidden = priority === "normal";
    card.priority.textContent = priority;
    card.priority.className = "priority " + priority;
    // Verified: a gateway the page trusts vouched for the agent id; claimed: the asker names itself.
    const verified = !!card.request.verified;
    card.identity.textContent = verified ? " verified" : " claimed";
    card.identity.className = "identity " + (verified ? "verified" : "claimed");
    card.identity.title = verified ? "A trusted gateway vouched for this agent id (its token decided it)."
      : "The asker names itself: any agent holding this namespace's asker credentials could use this name.";
    const askers = card.request.askers || [];
    card.askersBox.hidden = askers.length < 2;
    if (askers.length < 2) return;
    const names = askers.map((a) => (a.agent || "anonymous agent") + (a.verified ? " (verified)" : " (claimed)"));
    card.askers.textContent = "asked by " + askers.length + " agents";
    card.askers.title = "One answer goes to each: " + names.join(", ");
    card.askersList.replaceChildren(...names.map((name) => el("li", { text: name })));
  }

  function onRemoved(event) {
    if (state.view === "history") loadHistory();
    setTotal(event);
    renderEmpty();
    const card = state.cards.get(event.id);
    if (!card || card.submitting) return;  // our own submission settles the card itself
    if (event.reason === "lost") { pause(card); return; }
    closeOrDrop(event.id, event.reason, event.by, event.settled);
  }

  function pause(card) {
    // The server lost its lease (Redis went away, say): the card stays, paused, until the request
    // is delivered again or the server says what became of it.
    card.lost = true;
    card.root.classList.add("lost");
    notice(card, "Paused: waiting for the broker.");
    arm(card);
  }

  function answerText(card, settled) {
    if (!settled || !settled.answer || !settled.answer.answers) return "";
    const byId = new Map(card.request.questions.map((q) => [q.id, q]));
    return settled.answer.answers.map((item) => {
      const parts = [...item.selected];
      if (item.custom) parts.push("“" + item.custom + "”");
      if (item.edited) parts.push("edited: " + JSON.stringify(item.edited));
      const text = parts.length ? parts.join(", ") : "(skipped)";
      const question = byId.get(item.id);
      return card.request.questions.length > 1 && question ? question.question + " → " + text : text;
    }).join("; ");
  }

  function reasonText(card, reason, by, settled) {
    const who = by ? " by " + by : "";
    const answer = answerText(card, settled);
    return {
      answered: "Already answered" + who + (answer ? ": " + answer : "") + ".",
      cancelled: "Already dismissed" + who + ".",
      // Whoever withdrew it (the asker giving up, or housekeeping after its process ended), as History says.
      withdrawn: "Withdrawn: its asker stopped waiting (gave up, or its process ended).",
      expired: "It expired: the agent stopped waiting.",
      "dead-lettered": "It could not be shown and was set aside.",
      lost: "This server lost the lease; the question goes to the server that takes over.",
      moved: "Another server serves this namespace now; answer it there.",
    }[reason] || "This question is no longer pending.";
  }

  function closeOrDrop(id, reason, by, settled) {
    const card = state.cards.get(id);
    if (!card) return;
    const why = reasonText(card, reason, by, settled);
    if (!card.dirty) {
      // Untouched: no card to keep, but say what became of it rather than vanish silently.
      const first = card.request.questions[0];
      addNote(el("span", { class: "note-question", text: (first ? first.question : "A question") + " — " }), why);
      dropCard(id);
      return;
    }
    closeCard(card, why);  // keep what the person typed; say why it can no longer be sent
  }

  function addNote(...parts) {
    const note = el("p", { class: "note settled-note" }, ...parts);
    $("settled-notes").prepend(note);
    setTimeout(() => note.remove(), 20000);
    return note;
  }

  function closeCard(card, message) {
    card.closed = true;
    card.root.classList.add("closed");
    notice(card, message, true);
    arm(card);
    if (!card.root.querySelector(".dismiss"))
      card.actions.append(el("button", { type: "button", class: "dismiss", text: "Remove from the list", onclick: () => dropCard(card.id) }));
    renderEmpty();
  }

  function dropCard(id) {
    const card = state.cards.get(id);
    if (card) card.root.remove();
    state.cards.delete(id);
    renderEmpty();
  }

  // -- times -----------------------------------------------------------------------------------

  function span(ms) {
    const seconds = Math.max(0, Math.round(ms / 1000));
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h " + (Math.floor(seconds / 60) % 60) + " min";
    return Math.floor(seconds / 86400) + " d";
  }

  function now() { return Date.now() + state.skewMs; }

  function refreshTimes() {
    for (const card of state.cards.values()) renderTimes(card);
  }

  function renderTimes(card) {
    const request = card.request;
    renderAway(card);
    const waited = now() - request.createdMs;
    card.age.textContent = waited < 60000 ? "asked just now" : "waiting " + span(waited);
    card.age.title = "asked at " + new Date(request.createdMs).toLocaleString();
    if (request.deadlineMs) {
      const left = request.deadlineMs - now();
      card.left.hidden = false;
      card.left.textContent = left > 0 ? span(left) + " left" : "the asker's time is up";
      card.left.classList.toggle("urgent", left < 120000);
      card.left.title = "the agent stops waiting at " + new Date(request.deadlineMs).toLocaleString();
    }
  }

  // -- a card per request ----------------------------------------------------------------

  const LEVELS = { urgent: 0, normal: 1, low: 2 };

  function arrange() {
    // The providers' order (broker/answering/_schedule.py): urgent, normal, low; within a level each
    // agent's oldest question in turn (round-robin), so one chatty agent cannot bury another.
    const cards = [...state.cards.values()].sort((a, b) => a.request.createdMs - b.request.createdMs);
    const rank = new Map();
    const keys = new Map();
    for (const card of cards) {
      const level = LEVELS[card.request.priority] ?? 1;
      const turn = level + "\n" + card.request.namespace + "\n" + (card.request.agent || "");
      keys.set(card, [level, rank.get(turn) || 0, card.request.createdMs]);
      rank.set(turn, (rank.get(turn) || 0) + 1);
    }
    const order = (a, b) => { const x = keys.get(a), y = keys.get(b); return x[0] - y[0] || x[1] - y[1] || x[2] - y[2]; };
    cards.sort(order);
    const list = $("requests");
    if (cards.every((card, i) => list.children[i] === card.root)) return;
    const focused = document.activeElement;
    list.append(...cards.map((card) => card.root));  // moves each node: what was typed stays
    if (focused && focused !== document.activeElement && list.contains(focused)) focused.focus({ preventScroll: true });
  }

  function reopen(card) {
    // Served again (by this server after a restart, say): what was typed can be sent now.
    card.closed = false;
    card.lost = false;
    card.root.classList.remove("closed", "lost");
    const dismiss = card.root.querySelector(".dismiss");
    if (dismiss) dismiss.remove();
    notice(card, "");
    arm(card);
  }

  function addCard(request) {
    const known = state.cards.get(request.id);
    if (known) {
      known.unlisted = false;  // delivered: pending after all, whatever an earlier snapshot left out
      if ((known.closed || known.lost) && !known.submitting) reopen(known);
      known.request.askerAway = request.askerAway;
      known.request.awayUntilMs = request.awayUntilMs;
      known.request.askers = request.askers;
      known.request.priority = request.priority;
      known.request.quorum = request.quorum;
      renderAway(known);
      renderAsking(known);
      renderQuorum(known);
      if (!state.batching) { arrange(); renderEmpty(); }
      return;
    }
    const count = request.questions.length;
    const root = el("article", { class: "card", "data-id": request.id, "aria-label": (count === 1 ? request.questions[0].question : count + " questions") });
    const ageNode = el("span", { class: "age" });
    const leftNode = el("span", { class: "left", hidden: true });
    const who = el("span", { class: "who" },
      el("span", { class: "agent", text: request.agent || "anonymous agent" }),
      el("span", { class: "identity" }),
      request.owner ? el("span", { class: "owner", text: " · for " + request.owner }) : null);
    const where = state.namespaces.length > 1 ? el("span", { class: "namespace-chip", text: request.namespace }) : null;
    const awayNode = el("span", { class: "away", text: "asker away",
      title: "The asking process stopped. You can still answer: the agent gets the answer when it comes back." });
    const priorityNode = el("span", { class: "priority", hidden: true });
    const askersNode = el("span", { class: "askers" });
    const askersList = el("ul", { class: "askers-list", "aria-label": "agents asking this question" });
    const askersBox = el("details", { class: "askers-box", hidden: true }, el("summary", {}, askersNode), askersList);
    root.append(el("div", { class: "meta" }, priorityNode, where, who, ageNode, leftNode, awayNode,
      count > 1 ? el("span", { text: count + " questions" }) : null, askersBox));
    const card = { id: request.id, request, root, age: ageNode, left: leftNode, away: awayNode, priority: priorityNode,
      identity: who.querySelector(".identity"), askers: askersNode, askersList, askersBox, dirty: false, closed: false, submitting: false };
    renderAway(card);
    renderAsking(card);
    renderQuorum(card);
    renderTimes(card);
    root.addEventListener("input", () => {
      card.dirty = true;
      if (!card.closed && !card.lost && !card.submitting && card.notice) notice(card, "");
    });
    state.cards.set(request.id, card);
    const only = count === 1 ? request.questions[0] : null;
    if (only && only.planReview) renderPlan(card, only);
    else renderForm(card, false);
    $("requests").append(root);
    if (!state.batching) { arrange(); renderEmpty(); }
  }

  function clearBody(card) {
    while (card.root.childNodes.length > 1) card.root.lastChild.remove();
  }

  const SHOWN_LINES = 6;

  function lineCount(node) {
    // Lines as a reader counts them (paragraphs, list items, table rows, code lines), without layout.
    let lines = node.querySelectorAll("p, li, h1, h2, h3, h4, h5, h6, tr, blockquote").length;
    for (const pre of node.querySelectorAll("pre")) lines += pre.textContent.replace(/\n$/, "").split("\n").length;
    return lines;
  }

  // The detail, collapsed to its first lines when long; `card.planRead` says whether all of it was shown.
  function detailNode(question, card) {
    if (question.detailHtml === null || question.detailHtml === undefined) return null;
    const body = el("div", { class: "detail-body" });
    body.innerHTML = question.detailHtml;  // sanitised by the server (raw HTML off, safe links only)
    for (const table of body.querySelectorAll("table")) table.replaceWith(el("div", { class: "table-scroll" }, table.cloneNode(true)));
    const lines = lineCount(body);
    const node = el("div", { class: "detail" }, body);
    if (lines <= SHOWN_LINES + 2) { if (card) card.planRead = true; return node; }
    state.nodeIds = (state.nodeIds || 0) + 1;
    body.id = "detail-" + state.nodeIds;  // not the question id: an asker's text makes a poor id
    body.classList.add("collapsed");
    const toggle = el("button", { type: "button", class: "link show-all", "aria-expanded": "false", "aria-controls": body.id, text: "Show all " + lines + " lines" });
    toggle.addEventListener("click", () => {
      const open = body.classList.toggle("collapsed") === false;
      toggle.setAttribute("aria-expanded", String(open));
      toggle.textContent = open ? "Show less" : "Show all " + lines + " lines";
      if (open) card.planRead = true;
    });
    card.showAll = () => { if (body.classList.contains("collapsed")) toggle.click(); };
    node.append(toggle);
    return node;
  }

  // The whole of a text the detail shows cut: fetched on request; the server sends it only when its
  // bytes hash to the digest the question named, so what shows is exactly what the question named.
  function attachmentNode(attachment) {
    const node = el("div", { class: "attachment" });
    const label = "Show all " + attachment.size.toLocaleString("en") + " bytes";
    const button = el("button", { type: "button", class: "link show-attachment", text: label });
    const note = el("span", { class: "attachment-note", role: "status" });
    button.addEventListener("click", async () => {
      button.disabled = true;
      note.textContent = "Loading…";
      try {
        const data = await call("GET", "/api/attachments/" + encodeURIComponent(attachment.sha256));
        // What the server checked: these bytes hash to this digest. Wrapped, in a box of its own height.
        const about = el("div", { class: "attachment-about muted small" },
          data.size.toLocaleString("en") + " bytes · SHA-256 ", el("code", { class: "digest", text: data.sha256 }));
        const pre = el("pre", { class: "attachment-text", tabindex: "0", "aria-label": "the whole text, " + data.size.toLocaleString("en") + " bytes" },
          el("code", { text: data.text }));
        note.remove();  // an empty line under the text otherwise
        button.replaceWith(about, pre);
      } catch (e) {
        button.disabled = false;
        note.textContent = e.status === 404 ? "No longer kept (it expires with the question)." : e.message;
      }
    });
    node.append(button, note);
    return node;
  }

  function labelNode(label) {
    const shown = label.replace(RECOMMENDED, "");
    const node = el("span", { class: "label", text: shown || label });
    if (shown && shown !== label) return el("span", {}, node, el("span", { class: "badge recommended", text: "Recommended" }));
    return node;
  }

  // `code` spans in a question (Claude Code's "Allow Bash: `make test`?") as code, the rest as text.
  function inlineCode(text) {
    const node = el("span", {});
    const parts = text.split("`");
    if (parts.length < 3 || parts.length % 2 === 0) { node.textContent = text; return node; }
    parts.forEach((part, i) => { if (part) node.append(i % 2 ? el("code", { text: part }) : part); });
    return node;
  }

  function questionHeading(question, tag) {
    return el(tag || "h2", { class: "question-text" },
      question.header ? el("span", { class: "header-chip", text: question.header }) : null,
      inlineCode(question.question));
  }

  function renderPlan(card, question) {
    clearBody(card);
    card.kind = "plan";
    card.root.classList.add("plan-card");
    const review = question.planReview;
    card.planRead = false;
    card.showAll = null;
    card.root.append(questionHeading(question), detailNode(question, card));
    const approve = el("button", { type: "button", class: "primary approve", onclick: () => approvePlan(card, question, review.approve, review.approveText) }, labelNode(review.approveText));
    const refuse = review.refuse === null ? null
      : el("button", { type: "button", class: "refuse", "aria-expanded": "false", onclick: () => openDecline(card, question, review.refuse, review.refuseText) }, labelNode(review.refuseText));
    const hintId = "chat-hint-" + card.id;
    const chat = el("button", { type: "button", class: "cancel", text: "Chat about it", title: CHAT_HINT, "aria-describedby": hintId,
      onclick: () => cancelBatch(card, state.user + " wants to talk about this plan in your chat instead of answering here; ask there.") });
    const full = el("button", { type: "button", class: "link full-form", text: "Other answer…", onclick: () => { card.root.classList.remove("plan-card"); renderForm(card, true); } });
    card.actions = el("div", { class: "actions" }, approve, refuse, chat, full);
    card.decline = el("div", { class: "decline", hidden: true });
    card.notice = el("p", { class: "notice", role: "alert" });
    card.root.append(card.actions, el("p", { class: "visually-hidden", id: hintId, text: CHAT_HINT }), card.decline, card.notice);
    arm(card);
  }

  function approvePlan(card, question, label, shown) {
    // Approving what was not shown is not a decision: the first press shows the whole plan.
    if (!card.planRead) {
      card.showAll();
      notice(card, "The whole plan is shown now: read it, then press " + shown.replace(RECOMMENDED, "") + " again.");
      return;
    }
    sendPlan(card, question, label);
  }

  function openDecline(card, question, refuseLabel, refuseText) {
    const box = card.decline;
    if (!box.hidden) { box.querySelector("textarea").focus(); return; }
    box.replaceChildren();
    const noteId = "decline-note-" + card.id;
    const note = el("textarea", { id: noteId, class: "decline-note", placeholder: "What should change? The agent reads this as your answer." });
    const send = el("button", { type: "button", class: "primary send-decline", text: "Send: " + refuseText.replace(RECOMMENDED, ""),
      onclick: () => {
        const text = note.value.trim();
        // The seeds' single-select rule: free text replaces the choice, and any answer
        // other than the approve label declines the plan.
        const item = text ? { id: question.id, selected: [], custom: note.value } : { id: question.id, selected: [refuseLabel] };
        settle(card, "/answer", { answers: [item] });
      } });
    const back = el("button", { type: "button", class: "back", text: "Back", onclick: () => { box.hidden = true; card.actions.querySelector(".refuse").setAttribute("aria-expanded", "false"); } });
    box.append(el("label", { for: noteId, class: "small", text: "Request changes, with a note (optional)" }), note,
      el("div", { class: "actions" }, send, back));
    box.hidden = false;
    card.actions.querySelector(".refuse").setAttribute("aria-expanded", "true");
    arm(card);
    note.focus();
  }

  function renderForm(card, fromPlan) {
    clearBody(card);
    card.kind = "form";
    const count = card.request.questions.length;
    const form = el("form", { class: "answer-form", novalidate: true });
    for (const question of card.request.questions) form.append(questionNode(card, question, count));
    const send = el("button", { type: "submit", class: "primary send", text: count === 1 ? "Send answer" : "Send " + count + " answers" });
    const cancel = el("button", { type: "button", class: "danger cancel", text: count === 1 ? "Dismiss question" : "Dismiss all " + count, onclick: () => confirmCancel(card, cancel) });
    const back = fromPlan ? el("button", { type: "button", class: "link back", text: "Back to the plan", onclick: () => renderPlan(card, card.request.questions[0]) }) : null;
    const remember = rememberNode(card);
    card.actions = el("div", { class: "actions" }, send, cancel, back, remember ? remember.toggle : null);
    card.notice = el("p", { class: "notice", role: "alert" });
    form.append(card.actions);
    if (remember) form.append(remember.panel);
    form.append(card.notice);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      // Enter sends only from the Send button itself, never implicitly from an option.
      if (event.submitter !== send) return;
      sendForm(card, form);
    });
    form.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && event.target.tagName === "INPUT") event.preventDefault();
    });
    card.root.append(form);
    arm(card);
  }

  const TTLS = [[3600, "for 1 hour"], [86400, "for 1 day"], [604800, "for 7 days"]];

  // "Yes, and don't ask again": remember the answer for the asking agent or the whole namespace.
  function rememberNode(card) {
    const scopes = card.request.remember || [];
    if (!scopes.length) return null;
    const forAgent = scopes.includes("agent") ? el("option", { value: "agent" }) : null;
    const scope = el("select", { class: "remember-scope" },
      el("option", { value: "", text: "Just this once" }),
      forAgent,
      el("option", { value: "namespace", text: "Remember for everyone in " + card.request.namespace }));
    const ttl = el("select", { class: "remember-ttl", "aria-label": "Remember for how long", hidden: true },
      ...TTLS.map(([seconds, text]) => el("option", { value: String(seconds), text })));
    scope.addEventListener("change", () => { ttl.hidden = !scope.value; card.dirty = true; });
    card.remember = { scope, ttl, forAgent };
    renderRememberScope(card);
    const panelId = "remember-" + card.id;
    const panel = el("div", { class: "remember", id: panelId, hidden: true },
      el("label", {}, el("span", { class: "small", text: "Don't ask again? " }), scope), ttl);
    const toggle = el("button", { type: "button", class: "link remember-toggle", "aria-expanded": "false", "aria-controls": panelId, text: "Don't ask again…" });
    toggle.addEventListener("click", () => {
      panel.hidden = !panel.hidden;
      toggle.setAttribute("aria-expanded", String(!panel.hidden));
      if (!panel.hidden) scope.focus();
    });
    return { panel, toggle };
  }

  function confirmCancel(card, button) {
    if (card.confirming) return;
    card.confirming = true;
    const count = card.request.questions.length;
    const reason = el("input", { type: "text", class: "dismiss-reason", maxlength: "500", "aria-label": "Reason for dismissing (optional)", placeholder: "Why? (optional)" });
    const yes = el("button", { type: "button", class: "danger confirm-cancel", text: count === 1 ? "Yes, dismiss it" : "Yes, dismiss all " + count,
      onclick: () => { card.confirming = false; cancelBatch(card, null, reason.value.trim()); } });
    reason.addEventListener("keydown", (event) => { if (event.key === "Enter") { event.preventDefault(); } });
    const no = el("button", { type: "button", class: "keep", text: "Keep", onclick: () => restore() });
    const ask = el("span", { class: "confirm", role: "group", "aria-label": "Confirm dismissal" },
      el("span", { class: "small", text: "The agent is told you dismissed it. " }), reason, yes, no);
    function restore() { card.confirming = false; ask.replaceWith(button); button.focus(); }
    button.replaceWith(ask);
    arm(card);
    no.focus();
  }

  function questionNode(card, question, count) {
    const name = card.id + ":" + question.id;
    const fieldset = el("fieldset", { class: "question", "data-qid": question.id });
    fieldset.append(el("legend", { class: "visually-hidden", text: question.question }));
    fieldset.append(questionHeading(question, "h2"));
    const detail = detailNode(question, card);
    if (detail) fieldset.append(detail);
    if (question.attachment) fieldset.append(attachmentNode(question.attachment));
    const choices = el("div", { class: "choices" });
    const type = question.multiSelect ? "checkbox" : "radio";
    question.options.forEach((option, index) => {
      choices.append(el("label", { class: "choice" },
        el("input", { type, name, value: option.label, class: "option" }),
        el("span", { class: "choice-text" },
          index < 9 ? el("kbd", { class: "digit", "aria-hidden": "true", text: String(index + 1) }) : null,
          labelNode(option.text)),
        option.description ? el("span", { class: "desc", text: option.description }) : null));
    });
    const other = el("textarea", { class: "other", name: name + ":other", "aria-label": question.options.length ? "Other answer to: " + question.question : "Your answer to: " + question.question, placeholder: question.options.length ? "Other…" : "Your answer" });
    if (question.options.length) {
      // The free-text box only once "Other…" is picked: a card is its options, not an open text box.
      const otherBox = el("input", { type, name, value: "", class: "other-choice", "aria-label": "Other" });
      choices.append(el("label", { class: "choice" }, otherBox, el("span", { class: "choice-text", text: "Other…" })));
      other.hidden = true;
      const follow = () => {
        const was = other.hidden;
        other.hidden = !otherBox.checked;
        if (was && !other.hidden && document.activeElement === otherBox) other.focus();
      };
      for (const input of choices.querySelectorAll("input")) input.addEventListener("change", follow);
    }
    choices.append(other);
    fieldset.append(choices);
    if (question.editable) fieldset.append(editNode(question, fieldset));
    if (count > 1) {
      const skip = el("input", { type: "checkbox", class: "skip-box" });
      skip.addEventListener("change", () => { for (const input of choices.querySelectorAll("input, textarea")) input.disabled = skip.checked; });
      fieldset.append(el("label", { class: "skip" }, skip, " Skip this question"));
    }
    return fieldset;
  }

  // Edit before approve: the call's arguments as JSON, sent with the approving option. Checked here
  // (JSON, an object, the schema's required fields and top-level types) and in full on the server.
  // What an approval runs is shown with the card, from its top, without asking: the editor replaces it.
  function editNode(question, fieldset) {
    const original = question.editable.argumentsText;  // JSON that parses back to the arguments, made inert
    const shown = el("pre", { class: "edit-shown", tabindex: "0", "aria-label": "Arguments it runs with" }, el("code", { text: original }));
    const area = el("textarea", { class: "edit-args", spellcheck: "false", "aria-label": "Arguments of: " + question.question, hidden: true });
    area.value = original;
    const problem = el("p", { class: "edit-error", role: "alert", hidden: true });
    const undo = el("button", { type: "button", class: "link edit-undo", text: "Undo the edit", hidden: true });
    const toggle = el("button", { type: "button", class: "link edit-toggle", "aria-expanded": "false", text: "Edit arguments…" });
    const check = () => {
      let message = "";
      try { editedArguments(question, fieldset); } catch (error) { message = error.message; }
      problem.textContent = message;
      problem.hidden = !message;
      undo.hidden = area.value === original;
    };
    toggle.addEventListener("click", () => {
      area.hidden = !area.hidden;
      shown.hidden = !area.hidden;
      toggle.setAttribute("aria-expanded", String(!area.hidden));
      if (!area.hidden) {
        // an edit approves: pick the approving option, as the human means to
        const approve = [...fieldset.querySelectorAll("input.option")].find((i) => i.value === question.editable.approve);
        if (approve && !approve.checked) { approve.checked = true; approve.dispatchEvent(new Event("change", { bubbles: true })); }
        // from the top: a value set in script leaves the caret (and focus scrolls) at its end
        area.setSelectionRange(0, 0);
        area.focus({ preventScroll: true });
        area.scrollTop = 0;
      }
    });
    area.addEventListener("input", check);
    undo.addEventListener("click", () => { area.value = original; check(); });
    return el("div", { class: "edit" }, el("div", { class: "small muted", text: "Arguments it runs with:" }), shown, toggle, area, problem, undo);
  }

  const JSON_TYPES = { string: (v) => typeof v === "string", number: (v) => typeof v === "number",
    integer: (v) => Number.isInteger(v), boolean: (v) => typeof v === "boolean", array: Array.isArray,
    object: (v) => v !== null && typeof v === "object" && !Array.isArray(v), null: (v) => v === null };

  // The edited arguments, or undefined when the textarea is closed or unchanged; throws what is wrong.
  function editedArguments(question, fieldset) {
    const area = fieldset.querySelector("textarea.edit-args");
    if (!area || area.hidden) return undefined;
    let value;
    try { value = JSON.parse(area.value); } catch (error) { throw new Error("The edited arguments are not JSON: " + error.message); }
    if (!JSON_TYPES.object(value)) throw new Error("The edited arguments must be a JSON object ({…}).");
    if (JSON.stringify(value) === JSON.stringify(question.editable.arguments)) return undefined;
    const schema = question.editable.schema;
    if (schema && JSON_TYPES.object(schema)) {
      for (const name of Array.isArray(schema.required) ? schema.required : [])
        if (!(name in value)) throw new Error("The edited arguments need “" + name + "”.");
      for (const [name, property] of Object.entries(JSON_TYPES.object(schema.properties) ? schema.properties : {})) {
        const types = property && (Array.isArray(property.type) ? property.type : property.type ? [property.type] : []);
        if (name in value && types.length && !types.some((t) => JSON_TYPES[t] && JSON_TYPES[t](value[name])))
          throw new Error("“" + name + "” must be " + types.join(" or ") + ".");
      }
    }
    return value;
  }

  function collect(card, form) {
    const answers = [];
    const count = card.request.questions.length;
    for (const question of card.request.questions) {
      const fieldset = [...form.querySelectorAll("fieldset.question")].find((f) => f.dataset.qid === question.id);
      const skipBox = fieldset.querySelector(".skip-box");
      if (skipBox && skipBox.checked) { answers.push({ id: question.id, selected: [] }); continue; }
      const selected = [...fieldset.querySelectorAll("input.option")].filter((i) => i.checked).map((i) => i.value);
      const otherBox = fieldset.querySelector("input.other-choice");
      const text = fieldset.querySelector("textarea.other").value;
      const wantsOther = otherBox ? otherBox.checked : text.trim() !== "";
      const item = { id: question.id, selected: question.multiSelect || !wantsOther ? selected : [] };
      if (wantsOther) {
        if (!text.trim()) throw new Error("Write the Other answer to “" + question.question + "”, or pick an option.");
        item.custom = text;
      }
      if (!item.selected.length && item.custom === undefined)
        throw new Error(count === 1 ? "Pick an answer first." : "Answer or skip “" + question.question + "”.");
      const edited = question.editable ? editedArguments(question, fieldset) : undefined;
      if (edited !== undefined) {
        if (!item.selected.includes(question.editable.approve) || item.custom !== undefined)
          throw new Error("Edited arguments go with “" + question.editable.approveText + "”: pick it, or undo the edit.");
        item.edited = edited;
      }
      answers.push(item);
    }
    return { answers };
  }

  function notice(card, text, bad) {
    card.notice.textContent = text || "";
    card.notice.className = "notice" + (bad ? " bad" : "");
  }

  function arm(card) {
    const off = card.closed || card.lost || card.submitting || statusOf(card.request.namespace) !== "active"
      || redisOf(card.request.namespace) === "down" || !state.connected;
    for (const button of card.root.querySelectorAll(".actions button:not(.dismiss):not(.link):not(.back):not(.keep)")) button.disabled = off;
    card.root.classList.toggle("paused", off && !card.closed);
  }

  async function settle(card, path, body, reason) {
    card.submitting = true;
    notice(card, "Sending…");
    arm(card);
    try {
      const reply = await call("POST", "/api/requests/" + encodeURIComponent(card.id) + path, body);
      if (reply.pending) {
        // One vote of a quorum: the card stays until enough people agree.
        card.submitting = false;
        card.request.quorum = reply.quorum;
        renderQuorum(card);
        notice(card, "Your vote is recorded; the agent is answered once the policy's quorum is met.");
        arm(card);
        return;
      }
      const first = card.request.questions[0];
      const to = card.request.agent ? " to " + card.request.agent : "";
      const what = path === "/answer" ? "Sent" + to + ": " + (answerText(card, reply) || "your answer")
        : "Dismissed" + (reason ? ": " + reason : "");
      addNote(el("span", { class: "note-question", text: (first ? first.question : "A question") + " — " }), what + ".")
        .classList.add("sent-note");
      dropCard(card.id);
    } catch (error) {
      card.submitting = false;
      if (error.code === "NOT_PENDING") {
        const settled = error.winner;
        closeCard(card, settled ? reasonText(card, settled.state, settled.by, settled) : error.message);
        return;
      }
      const message = error.code === "OFFLINE" ? error.message
        : error.code === "BAD_ANSWER" ? "The answer does not fit the question: " + error.message
        : error.code === "LEASE_LOST" ? "This server no longer holds the lease; your answer is kept here. " + error.message
        : error.message + " (" + error.code + ")";
      notice(card, message, true);
      arm(card);
    }
  }

  function sendForm(card, form) {
    let answer;
    try { answer = collect(card, form); } catch (error) { notice(card, error.message, true); return; }
    if (card.remember && card.remember.scope.value) {
      if (answer.answers.some((a) => a.custom !== undefined || !a.selected.length)) {
        notice(card, "Only an answer that picks options can be remembered: free text and skips are one-offs.", true);
        return;
      }
      answer.remember = { scope: card.remember.scope.value, ttl: Number(card.remember.ttl.value) };
    }
    settle(card, "/answer", answer);
  }

  function sendPlan(card, question, label) {
    card.dirty = true;
    settle(card, "/answer", { answers: [{ id: question.id, selected: [label] }] });
  }

  function cancelBatch(card, message, reason) {
    card.dirty = true;
    if (reason) message = state.user + " dismissed the question: " + reason;
    settle(card, "/cancel", message ? { message } : {}, reason);
  }

  // -- keyboard ------------------------------------------------------------------------------

  function onKey(event) {
    if (event.ctrlKey || event.metaKey || event.altKey || !/^[1-9]$/.test(event.key)) return;
    const target = event.target;
    if (target.tagName === "TEXTAREA" || (target.tagName === "INPUT" && !["radio", "checkbox"].includes(target.type))) return;
    // The card the focus is in, else the first one on screen: never one further down, out of sight.
    const card = [...state.cards.values()].find((c) => c.root.contains(target)) || firstOnScreen();
    // A plan is approved (or refused) only with its own buttons: a digit never moves to them.
    if (!card || card.closed || card.submitting || card.kind === "plan") return;
    const index = Number(event.key) - 1;
    const fieldset = target.closest ? target.closest("fieldset.question") : null;
    const scope = fieldset && card.root.contains(fieldset) ? fieldset : card.root.querySelector("fieldset.question");
    const option = scope ? scope.querySelectorAll("input.option")[index] : null;
    if (!option || option.disabled) return;
    event.preventDefault();
    if (option.type === "checkbox") option.checked = !option.checked;
    else option.checked = true;
    option.focus();
    card.dirty = true;
  }

  function firstOnScreen() {
    // The first open card that starts in the window, else the first one showing any part; one
    // scrolled out of sight is never the one a key acts on.
    let partly = null;
    for (const node of $("requests").children) {
      const card = state.cards.get(node.dataset.id);
      if (!card || card.closed || node.hidden) continue;
      const box = node.getBoundingClientRect();
      if (box.bottom <= 0) continue;
      if (box.top >= window.innerHeight) break;
      if (box.top >= -4) return card;  // a few pixels of slack for scrolled-to positions
      partly = partly || card;
    }
    return partly;
  }

  // -- history ---------------------------------------------------------------------------------

  function showView(view) {
    state.view = view;
    $("pending-view").hidden = view !== "pending";
    $("history-view").hidden = view !== "history";
    $("remembered-view").hidden = view !== "remembered";
    $("show-pending").setAttribute("aria-pressed", String(view === "pending"));
    $("show-history").setAttribute("aria-pressed", String(view === "history"));
    $("show-remembered").setAttribute("aria-pressed", String(view === "remembered"));
    if (view === "history") loadHistory();
    if (view === "remembered") loadRemembered();
  }

  // A list view read from the API: list #id holds an item for each of items(data), or the error in their place;
  // #id-empty shows when there are none.
  async function loadList(id, path, items, item) {
    let data;
    try { data = await call("GET", path); }
    catch (error) { $(id).replaceChildren(el("li", { class: "error", text: error.message })); return; }
    const list = $(id);
    list.replaceChildren();
    $(id + "-empty").hidden = items(data).length > 0;
    for (const entry of items(data)) list.append(item(entry, data));
    return data;
  }

  async function loadHistory() {
    const data = await loadList("history", "/api/history?limit=50", (data) => data.entries, (entry) => historyItem(entry));
    // The server reads a bounded number of events per request: say so rather than "Nothing settled yet."
    const truncated = Boolean(data && data.truncated);
    $("history-truncated").hidden = !truncated;
    if (truncated) $("history-empty").hidden = true;
  }

  const VERB = { answered: "answered", cancelled: "dismissed", withdrawn: "withdrawn", expired: "expired", "dead-lettered": "could not be shown" };

  function historyItem(entry) {
    const when = new Date(entry.atMs);
    const head = el("div", { class: "meta" },
      state.namespaces.length > 1 ? el("span", { class: "namespace-chip", text: entry.namespace }) : null,
      el("span", { class: "event event-" + entry.event, text: VERB[entry.event] || entry.event }),
      entry.remembered ? el("span", { class: "by remembered-by", text: "by a remembered decision" + (entry.by ? " set by " + entry.by : "") })
        : entry.by ? el("span", { class: "by", text: "by " + entry.by }) : null,
      el("time", { datetime: when.toISOString(), text: when.toLocaleString() }),
      entry.agent ? el("span", { class: "agent", text: "asked by " + entry.agent + (entry.asker ? " (" + entry.asker + ")" : "") }) : null);
    const body = el("ul", { class: "history-answers" });
    for (const q of entry.questions) {
      let parts = [...(q.selected || [])];
      if (q.custom) parts.push("“" + q.custom + "”");
      if (q.edited) parts.push("edited: " + JSON.stringify(q.edited));
      if (q.verdict === "declined") parts = ["declined" + (q.custom ? ": “" + q.custom + "”" : (q.selected || []).length ? " (" + q.selected.join(", ") + ")" : "")];
      else if (q.verdict === "approved") parts = q.edited ? ["approved", "edited: " + JSON.stringify(q.edited)] : ["approved"];
      body.append(el("li", {},
        el("span", { class: "q", text: (q.question || "question " + q.id) + " " }),
        entry.event === "answered" ? el("span", { class: "a", text: "→ " + (parts.length ? parts.join(", ") : "(skipped)") }) : null));
    }
    if (entry.event !== "answered" && entry.message) body.append(el("li", { class: "muted message", text: entry.message }));
    // A card whose route was not recorded, to someone outside a routing group: that it settled, not what (docs/approvals.md).
    if (entry.hidden) body.append(el("li", { class: "muted not-shown", text: "routed, not shown" }));
    return el("li", { class: "history-item card" }, head, body);
  }

  // -- remembered answers ----------------------------------------------------------------------

  function loadRemembered() {
    return loadList("remembered", "/api/decisions", (data) => data.decisions,
      (decision, data) => rememberedItem(decision, data.nowMs));
  }

  function rememberedItem(decision, nowMs) {
    const set = new Date(decision.atMs);
    const expires = new Date(decision.expiresMs);
    const note = el("span", { class: "notice", role: "status" });
    const revoke = el("button", { type: "button", class: "danger revoke", text: "Revoke" });
    revoke.addEventListener("click", async () => {
      revoke.disabled = true;
      try {
        await call("POST", "/api/decisions/" + encodeURIComponent(decision.id) + "/revoke", { namespace: decision.namespace });
        loadRemembered();
      } catch (error) {
        note.textContent = error.message;
        note.className = "notice bad";
        revoke.disabled = false;
      }
    });
    const head = el("div", { class: "meta" },
      state.namespaces.length > 1 ? el("span", { class: "namespace-chip", text: decision.namespace }) : null,
      el("span", { class: "scope", text: decision.scope === "agent" ? "for agent " + decision.agent : "for everyone in " + decision.namespace }),
      el("span", { class: "by", text: "set by " + (decision.by || "?") + " via " + decision.provider }),
      el("time", { datetime: set.toISOString(), text: set.toLocaleString() }),
      el("time", { class: "expires", datetime: expires.toISOString(), title: expires.toLocaleString(), text: "expires in " + span(decision.expiresMs - nowMs) }));
    const body = el("p", { class: "remembered-answer" },
      el("span", { class: "q", text: (decision.header ? decision.header + " · " : "") + decision.question + " " }),
      el("span", { class: "a", text: "→ " + decision.selected.join(", ") }));
    return el("li", { class: "remembered-item card", "data-id": decision.id }, head, body,
      el("div", { class: "actions" }, revoke, note));
  }

  document.addEventListener("DOMContentLoaded", boot);
})();
