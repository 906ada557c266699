// sdk_check.mjs serves translated Responses bodies over HTTP on 127.0.0.1
// and reads each with the official openai SDK, the way a client would:
// responses.stream(...).finalResponse() for a stream, responses.create(...)
// for a plain response. It proves the SDK accepts the translation.
//
//   node sdk_check.mjs cases.json
//
// cases.json is [{name, file, stream, text?, status?, calls?, error?}]: the
// request's model names the case, file is the body served for it. It
// prints one JSON line per case ({name, ok, text, status, calls, error})
// and exits 1 when a case does not meet its expectations.
import { readFileSync } from 'node:fs';
import http from 'node:http';
import OpenAI from 'openai';

const cases = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const byName = new Map(cases.map((c) => [c.name, c]));

const server = http.createServer((req, res) => {
  let body = '';
  req.on('data', (d) => (body += d));
  req.on('end', () => {
    const c = byName.get(JSON.parse(body).model);
    if (!c) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'no such case', type: 'invalid_request_error' } }));
      return;
    }
    res.writeHead(200, { 'content-type': c.stream ? 'text/event-stream' : 'application/json' });
    res.end(readFileSync(c.file));
  });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const client = new OpenAI({
  apiKey: 'test',
  baseURL: `http://127.0.0.1:${server.address().port}/v1`,
  maxRetries: 0,
  timeout: 20000,
});

// outputText joins the output_text parts, as the SDK's output_text does
// (finalResponse() of a stream does not set output_text itself).
function outputText(r) {
  const texts = [];
  for (const item of r.output ?? []) {
    if (item.type !== 'message') continue;
    for (const part of item.content) if (part.type === 'output_text') texts.push(part.text);
  }
  return texts.join('');
}

let failed = false;
for (const c of cases) {
  const got = { name: c.name, ok: true };
  try {
    let r;
    if (c.stream) {
      const events = [];
      const stream = client.responses.stream({ model: c.name, input: 'hi' });
      stream.on('event', (e) => events.push(e.type));
      r = await stream.finalResponse();
      got.events = events.length;
    } else {
      r = await client.responses.create({ model: c.name, input: 'hi' });
      got.sdk_output_text = r.output_text;
      if (r.output_text !== outputText(r)) {
        got.ok = false;
        got.why = 'output_text differs from the output items';
      }
    }
    got.text = outputText(r);
    got.status = r.status;
    got.calls = (r.output ?? []).filter((i) => i.type === 'function_call').map((i) => ({ name: i.name, call_id: i.call_id, arguments: i.arguments }));
  } catch (e) {
    got.error = String(e?.message ?? e?.type ?? e);
  }
  if (c.error) {
    if (got.error === undefined) {
      got.ok = false;
      got.why = 'expected the SDK to raise';
    }
  } else if (got.error !== undefined) {
    got.ok = false;
  } else {
    if (c.text !== undefined && got.text !== c.text) {
      got.ok = false;
      got.why = 'text';
    }
    if (c.status !== undefined && got.status !== c.status) {
      got.ok = false;
      got.why = 'status';
    }
    if (c.calls !== undefined && JSON.stringify(got.calls) !== JSON.stringify(c.calls)) {
      got.ok = false;
      got.why = 'calls';
    }
  }
  failed ||= !got.ok;
  console.log(JSON.stringify(got));
}
server.close();
process.exit(failed ? 1 : 0);
