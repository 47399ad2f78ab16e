// kvd chat page: talks to this node's OpenAI-compatible API, same origin.
// Model output is only ever inserted with textContent (never innerHTML).
// The key stays in memory; in localStorage only when "remember" is ticked.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'kvd.chat.key';
const messages = [];       // the conversation sent with each request
let busy = null;           // the AbortController of the answer streaming

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = $('key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

function rememberKey() {
  try {
    if ($('remember').checked) localStorage.setItem(KEY_STORE, $('key').value.trim());
    else localStorage.removeItem(KEY_STORE);
  } catch (e) { /* storage disabled: the key stays in memory */ }
}

function showError(text) {
  $('error').textContent = text;
  $('error').hidden = !text;
}

// An API error (status and OpenAI's error object) in words a user can act on.
function describeError(status, err) {
  const msg = (err && err.message) || '';
  const code = (err && err.code) || '';
  if (status === 401) return 'The API key was refused (401): check the key. ' + msg;
  if (status === 403) return 'This key may not do that (403). ' + msg;
  if (status === 429) return 'The server is busy (429): try again in a moment. ' + msg;
  if (code === 'context_length_exceeded')
    return 'The conversation is too long for the model\'s context (400 context_length_exceeded): start a new chat or lower Max tokens. ' + msg;
  if (status === 400) return 'The request was refused (400' + (code ? ' ' + code : '') + '): ' + msg;
  return 'Error' + (status ? ' ' + status : '') + (code ? ' ' + code : '') + ': ' + (msg || 'unexpected answer');
}

async function errorOf(res) {
  let body = null;
  try { body = await res.json(); } catch (e) { /* not JSON */ }
  return describeError(res.status, body && body.error);
}

async function loadModels() {
  showError('');
  rememberKey();
  let res;
  try {
    res = await fetch('/v1/models', { headers: headers() });
  } catch (e) {
    showError('Cannot reach the server: ' + e.message);
    return;
  }
  if (!res.ok) { showError(await errorOf(res)); return; }
  const list = await res.json();
  const sel = $('model');
  sel.replaceChildren();
  for (const m of list.data || []) {
    const o = document.createElement('option');
    o.value = m.id;
    o.textContent = m.id;
    sel.append(o);
  }
  $('stats').textContent = sel.options.length + ' model(s) available';
}

function addMessage(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  const who = document.createElement('span');
  who.className = 'who';
  who.textContent = role === 'user' ? 'You' : 'Assistant';
  const body = document.createElement('div');
  body.className = 'text';
  body.textContent = text;
  div.append(who, body);
  $('log').append(div);
  div.scrollIntoView({ block: 'end' });
  return body;
}

function requestBody() {
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if ($('model').value) body.model = $('model').value;
  const t = parseFloat($('temperature').value);
  const n = parseInt($('max-tokens').value, 10);
  if (!Number.isNaN(t)) body.temperature = t;
  if (n > 0) body.max_tokens = n;
  return body;
}

// Reads the SSE stream: calls onData with each `data:` payload's JSON.
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart()).join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      onData(JSON.parse(data));
    }
  }
}

function showStats(usage, t0, tFirst) {
  const t1 = performance.now();
  if (!usage) { $('stats').textContent = 'done (no usage in the stream)'; return; }
  const n = usage.completion_tokens;
  const secs = (t1 - t0) / 1000;
  const rate = secs > 0 ? n / secs : 0;
  $('stats').textContent = n + ' tokens, ' + rate.toFixed(1) + ' tokens/s' +
    ' (prompt ' + usage.prompt_tokens + ' tokens, first token after ' +
    ((tFirst || t1) - t0).toFixed(0) + ' ms)';
  $('stats').dataset.tokens = String(n);
  $('stats').dataset.rate = rate.toFixed(3);
}

function setBusy(ctrl) {
  busy = ctrl;
  $('send').disabled = !!ctrl;
  $('stop').disabled = !ctrl;
  document.body.dataset.state = ctrl ? 'streaming' : 'idle';
}

async function send() {
  const text = $('prompt').value;
  if (busy || !text.trim()) return;
  showError('');
  $('stats').textContent = '';
  rememberKey();
  messages.push({ role: 'user', content: text });
  addMessage('user', text);
  $('prompt').value = '';
  const ctrl = new AbortController();
  setBusy(ctrl);
  let answer = '', usage = null, out = null, tFirst = 0;
  const t0 = performance.now();
  try {
    const res = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(),
      body: JSON.stringify(requestBody()), signal: ctrl.signal });
    if (!res.ok) { showError(await errorOf(res)); return; }
    out = addMessage('assistant', '');
    await readEvents(res, (ev) => {
      if (ev.error) throw new Error(describeError(0, ev.error));
      if (ev.usage) usage = ev.usage;
      const d = ev.choices && ev.choices[0] && ev.choices[0].delta;
      if (d && d.content) {
        if (!tFirst) tFirst = performance.now();
        answer += d.content;
        out.textContent = answer;
      }
    });
    showStats(usage, t0, tFirst);
  } catch (e) {
    if (e.name === 'AbortError') $('stats').textContent = 'stopped';
    else showError(e.message);
  } finally {
    if (out) {   // the answer so far (stopped or cut by an error) stays
      messages.push({ role: 'assistant', content: answer });
      out.parentElement.dataset.done = 'true';
    } else {
      messages.pop();   // no answer: the message is not part of the chat
    }
    setBusy(null);
    $('prompt').focus();
  }
}

function init() {
  try {
    const k = localStorage.getItem(KEY_STORE);
    if (k !== null) { $('key').value = k; $('remember').checked = true; }
  } catch (e) { /* no storage */ }
  $('conn').addEventListener('submit', (e) => { e.preventDefault(); loadModels(); });
  $('remember').addEventListener('change', rememberKey);
  $('compose').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $('stop').addEventListener('click', () => { if (busy) busy.abort(); });
  $('new-chat').addEventListener('click', () => {
    if (busy) busy.abort();
    messages.length = 0;
    $('log').replaceChildren();
    $('stats').textContent = '';
    showError('');
  });
  document.body.dataset.state = 'idle';
  if ($('key').value) loadModels();
}

init();
