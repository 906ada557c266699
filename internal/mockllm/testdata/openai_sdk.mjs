// Drives the mock with the official openai SDK (the repo's node_modules) and
// prints what the SDK made of each answer as one JSON line, for
// TestOpenAINodeSDK to check. Any error the SDK raises fails the run.
//
// Usage: node openai_sdk.mjs http://127.0.0.1:PORT/v1
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'test', maxRetries: 0 });
const out = {};

const created = await client.responses.create({
  model: 'mock',
  input: 'Tell me a story',
  instructions: 'Be brief.',
  max_output_tokens: 12,
});
out.create = { status: created.status, text: created.output_text, usage: created.usage };

const stream = client.responses.stream({
  model: 'mock',
  input: [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me a story' }] }],
  max_output_tokens: 12,
});
let deltas = '';
stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
const final = await stream.finalResponse();
// openai 6.30.1 sets output_text on finalResponse() only for parsed
// (text.format) requests, so read the message itself, as the SDK would.
const finalText = final.output
  .filter((o) => o.type === 'message')
  .flatMap((o) => o.content.filter((c) => c.type === 'output_text').map((c) => c.text))
  .join('');
out.stream = { status: final.status, text: finalText, deltas, usage: final.usage };

// No encoding_format: the SDK asks for base64 and decodes it itself.
const inputs = ['hello world', 'one two three'];
const b64 = await client.embeddings.create({ model: 'mock', input: inputs });
const floats = await client.embeddings.create({ model: 'mock', input: inputs, encoding_format: 'float' });
out.embeddings = {
  base64: b64.data.map((d) => d.embedding),
  float: floats.data.map((d) => d.embedding),
  usage: b64.usage,
};

const completion = await client.completions.create({
  model: 'mock',
  prompt: 'Tell me a story',
  max_tokens: 10,
  stream: true,
  stream_options: { include_usage: true },
});
let text = '';
let finish = null;
let usage = null;
for await (const chunk of completion) {
  for (const c of chunk.choices) {
    text += c.text;
    finish = c.finish_reason ?? finish;
  }
  usage = chunk.usage ?? usage;
}
out.completions = { text, finish, usage };

console.log(JSON.stringify(out));
