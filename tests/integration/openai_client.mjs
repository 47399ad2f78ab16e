// tests/integration/openai_client.mjs - the official `openai` npm client
// against kvd's HTTP front, for http_openai.sh (openai@4) and
// http_clients.sh (the current major). Arguments, output and errors:
// clients_run.mjs (jobs on stdin, or one in the arguments). Cases:
//   plain, stream            completions (PROMPT_JSON a string or ids)
//   chat, chatstream         chat completions (PROMPT_JSON messages); the
//                            answer also has "role" and "object"
//   responses, responsesstream  client.responses.create (PROMPT_JSON a
//                            string or messages as input items); also
//                            "status", "object" and "events" (streamed)
//   chatabort                a chat stream the client aborts after its
//                            second chunk
//   chatn, chatnstream       chat completions with n: 3: "texts" and
//                            "finish_reasons" by choice index
// A refusal is {status, code, type, class}: class is the client's
// exception (AuthenticationError for 401, BadRequestError, ...).
import { args, load, run, readThenAbort } from "./clients_run.mjs";

const { moduleDir, jobs } = args();
const mod = await load(moduleDir, "openai");
const OpenAI = mod.default?.OpenAI ?? mod.OpenAI ?? mod.default;
const client = (a) => new OpenAI({ baseURL: a.baseURL, apiKey: a.apiKey, maxRetries: 0,
				     timeout: 60000 });
const sampling = (a) => ({ model: a.model, temperature: a.temperature, seed: a.seed });
const cmpl = (a) => ({ ...sampling(a), prompt: a.prompt, max_tokens: a.maxTokens, stop: a.stop });
const chat = (a) => ({ ...sampling(a), messages: a.prompt, max_tokens: a.maxTokens, stop: a.stop });
// the Responses API has no seed nor stop (kvd's seed is drawn: greedy only)
const resp = (a) => ({ model: a.model, input: a.prompt, max_output_tokens: a.maxTokens,
		       temperature: a.temperature });
const respFinish = (r) => r.status === "incomplete" ? "length" : "stop";

const cases = {
	async plain(a) {
		const r = await client(a).completions.create(cmpl(a));
		return { text: r.choices[0].text, finish_reason: r.choices[0].finish_reason,
			 completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens };
	},
	async stream(a) {
		const s = await client(a).completions.create({ ...cmpl(a), stream: true });
		let text = "", finish = null, usage = null, chunks = 0;
		for await (const c of s) {
			chunks++;
			text += c.choices[0]?.text ?? "";
			finish = c.choices[0]?.finish_reason ?? finish;
			usage = c.usage ?? usage;
		}
		return { text, finish_reason: finish, chunks,
			 completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens };
	},
	async chat(a) {
		const r = await client(a).chat.completions.create(chat(a));
		const m = r.choices[0].message;
		return { text: m.content, role: m.role, object: r.object,
			 finish_reason: r.choices[0].finish_reason,
			 completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens };
	},
	async chatstream(a) {
		const s = await client(a).chat.completions.create({ ...chat(a), stream: true });
		let text = "", finish = null, usage = null, chunks = 0, role = null, object = null;
		for await (const c of s) {
			chunks++;
			object = c.object;
			const d = c.choices[0]?.delta ?? {};
			role = role ?? d.role ?? null;
			text += d.content ?? "";
			finish = c.choices[0]?.finish_reason ?? finish;
			usage = c.usage ?? usage;
		}
		return { text, finish_reason: finish, chunks, role, object,
			 completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens };
	},
	async responses(a) {
		const r = await client(a).responses.create(resp(a));
		return { text: r.output_text, finish_reason: respFinish(r), status: r.status,
			 object: r.object, completion_tokens: r.usage.output_tokens,
			 prompt_tokens: r.usage.input_tokens };
	},
	async responsesstream(a) {
		const s = await client(a).responses.create({ ...resp(a), stream: true });
		let text = "", done = null, chunks = 0;
		const events = [];
		for await (const e of s) {
			if (!events.includes(e.type))
				events.push(e.type);
			if (e.type === "response.output_text.delta") {
				chunks++;
				text += e.delta;
			}
			if (e.type === "response.completed" || e.type === "response.incomplete")
				done = e.response;
		}
		return { text, finish_reason: done && respFinish(done), status: done?.status,
			 chunks, events, completion_tokens: done?.usage.output_tokens,
			 prompt_tokens: done?.usage.input_tokens };
	},
	async chatn(a) {
		const r = await client(a).chat.completions.create({ ...chat(a), n: 3 });
		return { texts: r.choices.map((c) => c.message.content),
			 index: r.choices.map((c) => c.index),
			 finish_reasons: r.choices.map((c) => c.finish_reason),
			 completion_tokens: r.usage.completion_tokens, prompt_tokens: r.usage.prompt_tokens };
	},
	async chatnstream(a) {
		const s = await client(a).chat.completions.create({ ...chat(a), n: 3, stream: true });
		const texts = ["", "", ""], finish = [null, null, null];
		let usage = null, chunks = 0;
		for await (const c of s) {
			chunks++;
			for (const ch of c.choices) {
				if (!(ch.index >= 0 && ch.index < 3))
					throw new Error(`a chunk names choice ${ch.index}`);
				texts[ch.index] += ch.delta?.content ?? "";
				finish[ch.index] = ch.finish_reason ?? finish[ch.index];
			}
			usage = c.usage ?? usage;
		}
		return { texts, finish_reasons: finish, chunks,
			 completion_tokens: usage?.completion_tokens, prompt_tokens: usage?.prompt_tokens };
	},
	async chatabort(a) {
		const s = await client(a).chat.completions.create({ ...chat(a), stream: true });
		return readThenAbort((async function* () {
			for await (const c of s)
				yield c.choices[0]?.delta?.content;
		})(), 2, () => s.controller.abort());
	},
};

await run(jobs, cases, (e) => e instanceof OpenAI.APIError
	? { status: e.status, code: e.code ?? e.error?.code, type: e.type ?? e.error?.type }
	: null);
