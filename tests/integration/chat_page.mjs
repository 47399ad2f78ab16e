// tests/integration/chat_page.mjs - drives kvd's chat page (GET /) in
// headless Chromium through puppeteer-core, for chat_page.sh. Prints one
// JSON line with what the page showed and every request it made:
//   {"wrong_key_error", "models", "answer", "stats", "tokens", "rate",
//    "requests", "console_errors", "unlabelled", "narrow_overflow",
//    "shift_enter_newline", "stop_clicked_streaming", "stop_stats",
//    "context_error", "chat_bodies"}
//
//   node chat_page.mjs MODULE_DIR CHROMIUM URL KEY WRONG_KEY MESSAGE TEMPERATURE MAX_TOKENS PNG
// The page is used as a person would: type the wrong key and load the
// models (the 401 shows), the right key, open Settings and set the
// temperature and max tokens, type the message and press Enter, wait for
// the answer to finish streaming; then a screenshot into PNG. Then a
// long answer stopped with Stop, and one too long for the context.
import { createRequire } from "node:module";

const [moduleDir, chromium, url, key, wrongKey, message, temperature, maxTokens, png] =
	process.argv.slice(2);
const require = createRequire(moduleDir + "/");
const puppeteer = require("puppeteer-core");
const args = ["--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
	"--disable-extensions", "--disable-background-networking"];
if (process.getuid && process.getuid() === 0) args.push("--no-sandbox");

const browser = await puppeteer.launch({ executablePath: chromium, headless: true, args,
	userDataDir: process.env.CHAT_PAGE_PROFILE });
const out = { requests: [], console_errors: [] };
try {
	const page = await browser.newPage();
	page.setDefaultTimeout(60000);
	await page.setViewport({ width: 900, height: 800 });
	out.chat_bodies = [];   // what each chat request sent
	page.on("request", (r) => {
		out.requests.push(r.url());
		if (r.url().endsWith("/v1/chat/completions")) out.chat_bodies.push(JSON.parse(r.postData()));
	});
	// (Chromium logs each 4xx as a console error: the wrong key's 401 and
	// the context's 400 are wanted)
	page.on("console", (m) => {
		if (m.type() === "error" && !/status of (401|400) \((Unauthorized|Bad Request)\)/.test(m.text()))
			out.console_errors.push(m.text());
	});
	page.on("pageerror", (e) => out.console_errors.push(String(e)));
	await page.goto(url, { waitUntil: "networkidle0" });

	// every form control has a label
	out.unlabelled = await page.$$eval("input, select, textarea",
		(els) => els.filter((e) => e.labels.length === 0).map((e) => e.id));

	// the wrong key: the 401 in words
	await page.type("#key", wrongKey);
	await page.click("#load");
	await page.waitForFunction(() => !document.getElementById("error").hidden);
	out.wrong_key_error = await page.$eval("#error", (e) => e.textContent);

	// the right key: the models
	await page.$eval("#key", (e) => { e.value = ""; });
	await page.type("#key", key);
	await page.click("#load");
	await page.waitForFunction(() => document.getElementById("model").options[0].value !== "");
	out.models = await page.$$eval("#model option", (os) => os.map((o) => o.value));

	// Settings
	await page.click("#settings summary");
	for (const [id, v] of [["#temperature", temperature], ["#max-tokens", maxTokens]]) {
		await page.$eval(id, (e) => { e.value = ""; });
		await page.type(id, v);
	}

	// Shift+Enter is a newline, not a send
	await page.type("#prompt", "draft");
	await page.keyboard.down("Shift");
	await page.keyboard.press("Enter");
	await page.keyboard.up("Shift");
	out.shift_enter_newline = await page.$eval("#prompt", (e) => e.value === "draft\n");
	await page.$eval("#prompt", (e) => { e.value = ""; });

	// send with Enter, wait for the stream's end
	await page.type("#prompt", message);
	await page.keyboard.press("Enter");
	await page.waitForSelector(".msg.assistant[data-done=true]");
	await page.waitForFunction(() => document.body.dataset.state === "idle");
	out.answer = await page.$eval(".msg.assistant .text", (e) => e.textContent);
	out.user = await page.$eval(".msg.user .text", (e) => e.textContent);
	out.stats = await page.$eval("#stats", (e) => e.textContent);
	out.tokens = await page.$eval("#stats", (e) => Number(e.dataset.tokens ?? -1));
	out.rate = await page.$eval("#stats", (e) => Number(e.dataset.rate ?? -1));
	out.error_after = await page.$eval("#error", (e) => (e.hidden ? "" : e.textContent));
	await page.screenshot({ path: png });

	// Stop: a long answer aborted once its first words show
	const setMax = async (v) => {
		await page.$eval("#max-tokens", (e) => { e.value = ""; });
		await page.type("#max-tokens", v);
	};
	await setMax("1500");
	await page.type("#prompt", "Tell me more");
	await page.keyboard.press("Enter");
	await page.waitForFunction(() => {
		const a = document.querySelectorAll(".msg.assistant .text");
		return a.length === 2 && a[1].textContent.length > 0;
	});
	out.stop_clicked_streaming = await page.$eval("body", (b) => b.dataset.state === "streaming");
	await page.click("#stop");
	await page.waitForFunction(() => document.body.dataset.state === "idle");
	out.stop_stats = await page.$eval("#stats", (e) => e.textContent);

	// too long for the context: the 400 in words
	await setMax("4000");
	await page.type("#prompt", "And then?");
	await page.keyboard.press("Enter");
	await page.waitForFunction(() => !document.getElementById("error").hidden);
	out.context_error = await page.$eval("#error", (e) => e.textContent);

	// a narrow screen: nothing wider than the viewport
	await page.setViewport({ width: 360, height: 740 });
	out.narrow_overflow = await page.evaluate(() =>
		document.documentElement.scrollWidth > window.innerWidth);
} catch (e) {
	out.failure = String(e);
} finally {
	await browser.close();
}
console.log(JSON.stringify(out));
