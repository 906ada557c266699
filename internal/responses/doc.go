// Package responses serves the OpenAI Responses API (POST /v1/responses)
// from a backend that only serves chat completions: it translates the
// request into a chat completions request (ToChat), and the answer back,
// whole (FromChat) or as a stream, one chat frame at a time (Stream). It is
// pure translation: no HTTP, no state beyond one stream, nothing stored.
//
// The shapes follow what engines emit and what the official SDKs require:
// Ollama 0.17.4's own /v1/responses recordings (testdata/ollama-0.17.4 at
// the repository root) for field names and event order, and the openai npm
// SDK's types for required fields. Tests run the translation through
// openai-node (responses.stream().finalResponse(), responses.create()) and
// openai-go.
//
// # The request
//
// A request member either translates, is refused (a *Refusal naming it,
// for a 400), or is ignored because it changes nothing the client gets
// back. Unknown top-level members are refused, as OpenAI refuses them: a
// member dropped silently would answer a request the client did not send.
// An explicit null means "not set", like a missing member: a null
// temperature is left out, never sent as 0.
//
//	| Responses request                    | chat completions request                                             |
//	|--------------------------------------|----------------------------------------------------------------------|
//	| model                                | model (required)                                                     |
//	| instructions                         | a leading system message                                             |
//	| input: a string                      | one user message                                                     |
//	| input: message, role user            | user message; content a string, or parts: input_text → text,         |
//	|                                      | input_image with image_url → image_url (detail kept); one text part  |
//	|                                      | becomes a string                                                     |
//	| input: message, role system or       | system message (text parts only); chat engines and templates know    |
//	| developer                            | "system", and OpenAI reads a developer message as one                |
//	| input: message, role assistant       | assistant message; output_text (and input_text, refusal) parts       |
//	|                                      | joined into one string; id, status, annotations ignored              |
//	| input: function_call                 | a tool call of the assistant message before it (the same turn), or   |
//	|                                      | of a new one with null content                                       |
//	| input: function_call_output          | tool message (tool_call_id, content: a string or text parts)         |
//	| input: reasoning                     | ignored: chat has no field for it (this backend never returns one)   |
//	| max_output_tokens                    | max_tokens                                                           |
//	| temperature, top_p                   | temperature, top_p                                                   |
//	| stream                               | stream, and stream_options.include_usage: true, always: the usage    |
//	|                                      | chunk is where the Responses usage comes from                        |
//	| tools: type function                 | tools: {type: function, function: {name, description, parameters,    |
//	|                                      | strict}}; null members left out. strict goes only when given: absent,|
//	|                                      | the Responses default is true and chat's false (engines mostly       |
//	|                                      | ignore it)                                                           |
//	| tool_choice auto, none, required,    | tool_choice, the function as {type: function, function: {name}};     |
//	| {type: function, name}               | auto and none are left out when there are no tools                   |
//	| parallel_tool_calls                  | parallel_tool_calls (left out when there are no tools: OpenAI's chat |
//	|                                      | API refuses it then)                                                 |
//	| text.format json_schema              | response_format {type: json_schema, json_schema: {name, schema,      |
//	|                                      | description, strict}}                                                |
//	| text.format json_object / text       | response_format {type: json_object} / left out (the default)         |
//	| text.verbosity                       | verbosity                                                            |
//	| reasoning.effort                     | reasoning_effort                                                     |
//	| user                                 | user                                                                 |
//
//	| Refused (a 400 naming the param)     | why                                                                  |
//	|--------------------------------------|----------------------------------------------------------------------|
//	| previous_response_id, conversation,  | they need stored responses; nothing is stored here                   |
//	| input item_reference                 |                                                                      |
//	| background: true                     | needs stored responses (false and null are fine)                     |
//	| prompt                               | prompt templates are stored by OpenAI                                |
//	| tools other than function            | built-in tools (web_search, file_search, computer_use,               |
//	| (web_search, file_search, mcp, …);   | code_interpreter, image_generation, mcp, shell, custom, …) run on    |
//	| tool_choice of any other type        | OpenAI's side; allowed_tools has no chat equivalent here             |
//	| input_image by file_id, input_file,  | need OpenAI's file storage, or have no chat equivalent here; images  |
//	| images outside user messages, other  | only go in user messages                                             |
//	| item or content part types           |                                                                      |
//	| truncation: "auto"                   | the backend does not drop input to fit its context ("disabled" fine) |
//	| top_logprobs > 0, include            | log probabilities are not translated back                            |
//	| message.output_text.logprobs         |                                                                      |
//	| context_management (non-empty)       | compaction is OpenAI's                                               |
//	| any other top-level member           | unknown: refused, not dropped                                        |
//	| a repeated member                    | clients' JSON libraries keep the last of repeated keys, gjson reads  |
//	|                                      | the first: the engine would run another request than the client's    |
//
//	| Ignored (accepted, no effect)        | why                                                                  |
//	|--------------------------------------|----------------------------------------------------------------------|
//	| store                                | the translation stores nothing, whatever it says; responses echo     |
//	|                                      | store: false                                                         |
//	| metadata                             | only echoed in the response                                          |
//	| reasoning.summary, generate_summary  | no reasoning items are produced; OpenAI does not promise a summary   |
//	|                                      | either                                                               |
//	| include (other values)               | they name outputs of built-in tools or stored or encrypted           |
//	|                                      | reasoning, which a chat backend never produces                       |
//	| stream_options (include_obfuscation) | nothing is obfuscated                                                |
//	| service_tier, prompt_cache_key,      | billing and cache hints of OpenAI's; engines cache prefixes on their |
//	| prompt_cache_retention,              | own; the gateway has its own abuse controls                          |
//	| safety_identifier                    |                                                                      |
//	| max_tool_calls                       | it bounds built-in tool calls, which are refused                     |
//	| truncation "disabled", background    | the behaviour they ask for is the only one                           |
//	| false, top_logprobs 0                |                                                                      |
//
// # The answer
//
// A response object has id, object "response", created_at, status, model
// (the request's), output, usage (null until the close, and when the
// engine sent none), error, incomplete_details, and echoes the request's
// instructions, max_output_tokens, temperature, top_p (null when unset:
// the engine's defaults are not known here), tools, tool_choice, text,
// parallel_tool_calls, reasoning, metadata, and store: false. The output
// is a message item with one output_text part (msg_X for resp_X), then a
// function_call item per tool call (fc_X_n; the engine's call id as
// call_id, or call_X_n when it gives none). Usage maps prompt_tokens →
// input_tokens and completion_tokens → output_tokens, with
// input_tokens_details.cached_tokens and
// output_tokens_details.reasoning_tokens from the engine's details, or 0.
//
// finish_reason "length" makes the response incomplete with
// incomplete_details.reason "max_output_tokens" (as OpenAI does, where
// Ollama's own /v1/responses says completed), "content_filter" likewise;
// every other finish_reason completes it. Reasoning text the engine
// streams (reasoning_content) and choices other than the first are not
// translated.
//
// # The stream
//
// Frame takes the engine's chat frames one at a time and returns the
// Responses events for each: response.created and response.in_progress
// first; response.output_item.added and response.content_part.added when
// text begins, then response.output_text.delta per chunk;
// response.output_item.added (a function_call) when a tool call begins,
// then response.function_call_arguments.delta; and at the close, the done
// events of every item (output_text.done, content_part.done,
// function_call_arguments.done, output_item.done) and
// response.completed, or response.incomplete. Every event carries
// sequence_number, counting from 0. The close comes once the finish_reason
// and the usage have both arrived, or at [DONE]. An error frame of the
// engine's becomes an error event and response.failed.
//
// A stream the user stops (End(Stopped)) closes as completed, with the text
// so far: response.completed is the one closing event that both official
// helpers resolve with (openai-python's get_final_response() raises
// without it; openai-node's finalResponse() resolves on
// response.incomplete too, but with the snapshot of response.created:
// status "in_progress", no usage), and the gateway closes a stopped chat
// stream the same way, with finish_reason "stop". The engine gone
// (End with any other reason) fails the response, which both SDKs raise.
package responses
