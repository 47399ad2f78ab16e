// tests/integration/openai_client.mjs - the official `openai` npm client
// against kvd's HTTP front, for http_openai.sh. Prints one JSON line:
//   {"text", "finish_reason", "completion_tokens", "prompt_tokens", "chunks"}
// or, when the server refused, {"status", "code", "type"}.
//
//   node openai_client.mjs MODULE_DIR BASE_URL KEY MODEL MODE PROMPT_JSON MAX_TOKENS TEMPERATURE SEED
// MODE: plain|stream (completions: PROMPT_JSON a JSON string or an array
// of token ids) or chat|chatstream (chat completions: PROMPT_JSON an array
// of {role, content} messages). Chat answers print the message content as
// "text" and also "role" (the assistant's) and "object" (the last seen).
import { createRequire } from "node:module";

const [moduleDir, baseURL, apiKey, model, mode, promptJson, maxTokens, temperature, seed] =
	process.argv.slice(2);
const require = createRequire(moduleDir + "/");
const OpenAI = require("openai");
const client = new (OpenAI.default ?? OpenAI)({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const chat = mode === "chat" || mode === "chatstream";
const params = {
	model,
	[chat ? "messages" : "prompt"]: JSON.parse(promptJson),
	max_tokens: Number(maxTokens),
	temperature: Number(temperature),
	seed: Number(seed),
};

try {
	if (mode === "chatstream") {
		const stream = await client.chat.completions.create({ ...params, stream: true });
		let text = "", finish = null, usage = null, chunks = 0, role = null, object = null;
		for await (const chunk of stream) {
			chunks++;
			object = chunk.object;
			const d = chunk.choices[0]?.delta ?? {};
			if (d.role) role = role ?? d.role;
			text += d.content ?? "";
			if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
			if (chunk.usage) usage = chunk.usage;
		}
		console.log(JSON.stringify({ text, finish_reason: finish, chunks, role, object,
			completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens }));
	} else if (mode === "chat") {
		const r = await client.chat.completions.create(params);
		const m = r.choices[0].message;
		console.log(JSON.stringify({ text: m.content, role: m.role, object: r.object,
			finish_reason: r.choices[0].finish_reason,
			completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens }));
	} else if (mode === "stream") {
		const stream = await client.completions.create({ ...params, stream: true });
		let text = "", finish = null, usage = null, chunks = 0;
		for await (const chunk of stream) {
			chunks++;
			text += chunk.choices[0]?.text ?? "";
			if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
			if (chunk.usage) usage = chunk.usage;
		}
		console.log(JSON.stringify({ text, finish_reason: finish, chunks,
			completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens }));
	} else {
		const r = await client.completions.create(params);
		console.log(JSON.stringify({ text: r.choices[0].text, finish_reason: r.choices[0].finish_reason,
			completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens }));
	}
} catch (e) {
	if (e instanceof (OpenAI.APIError ?? OpenAI.default.APIError)) {
		console.log(JSON.stringify({ status: e.status, code: e.code ?? e.error?.code, type: e.type ?? e.error?.type }));
	} else {
		console.log(JSON.stringify({ exception: String(e) }));
		process.exit(2);
	}
}
