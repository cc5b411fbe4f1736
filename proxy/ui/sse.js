// Server-Sent Events read off a fetch body (an EventSource cannot send Authorization): shared
// by the page's event stream (app.js) and the fleet's (fleet.js).
'use strict';

// Reads `body` until it ends or `current()` turns false, calling `onMessage({id, event, data})`
// for each message (data: its data lines joined; '' for a message with an id only) and
// `onRetry(ms)` for each `retry:` field.
async function readSse(body, current, onMessage, onRetry) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let message = { id: null, event: null, data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done || !current()) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + (buffer.startsWith('\r\n', end) ? 2 : 1));
      if (line === '') {
        onMessage({ id: message.id, event: message.event, data: message.data.join('\n') });
        message = { id: null, event: null, data: [] };
        if (!current()) return;
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'id') message.id = value;
      else if (field === 'event') message.event = value;
      else if (field === 'data') message.data.push(value);
      else if (field === 'retry' && /^\d+$/.test(value)) onRetry(Math.min(Number(value), 30000));
    }
  }
}

// An ownership event's JSON, or null when it is not one.
function ownershipEvent(data) {
  let event;
  try {
    event = JSON.parse(data);
  } catch (_) {
    return null;
  }
  if (typeof event !== 'object' || event === null || typeof event.resource !== 'string') return null;
  return event;
}
