// The shipped Dreamverse web client against a worldcast server, driven as a user would, in Chromium.
//
// A manual check (it needs FastVideo's apps/dreamverse/web built against the server; nothing is fetched here):
//   worldcast serve --port 8391 --dreamverse-segment 2 --dreamverse-segment-cap 3
//   cd FastVideo/apps/dreamverse/web && npm ci && BACKEND_PORT=8391 npx next build && npx next start --port 5299
//   DREAMVERSE_WEB=FastVideo/apps/dreamverse/web node tests/dreamverse_client_check.mjs
// It starts a custom-prompt project, rewrites it from the composer, starts a new project from the sidebar,
// waits for the segment cap (the download button), leaves; prints every message and exits 1 on an `error`
// message or a step that times out. Env: DREAMVERSE_WEB (the client, for its playwright-core), CLIENT_URL
// (http://127.0.0.1:5299), SERVER_URL (http://127.0.0.1:8391), CHROMIUM (/usr/bin/chromium), SHOTS (/tmp).
const web = process.env.DREAMVERSE_WEB;
if (!web) { console.error('set DREAMVERSE_WEB to the built apps/dreamverse/web'); process.exit(2); }
const { chromium } = await import(`${web}/node_modules/playwright-core/index.mjs`);
const CLIENT = process.env.CLIENT_URL || 'http://127.0.0.1:5299';
const SERVER = process.env.SERVER_URL || 'http://127.0.0.1:8391';
const SHOTS = process.env.SHOTS || '/tmp';
let failed = false;

const log = (...a) => console.log(new Date().toISOString().slice(11, 23), ...a);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox', '--autoplay-policy=no-user-gesture-required'] });
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
const sent = [], recv = [];
let binaries = 0;
page.on('websocket', ws => {
  ws.on('framesent', f => { if (typeof f.payload === 'string') { const m = JSON.parse(f.payload); sent.push(m); log('>>', m.type, m.rewrite_instruction || m.initial_rollout_prompt || ''); } });
  ws.on('framereceived', f => { if (typeof f.payload === 'string') { const m = JSON.parse(f.payload); recv.push(m); if (!['step_complete'].includes(m.type)) log('<<', m.type, m.segment_idx ?? m.reason ?? m.error_code ?? m.message ?? ''); } else binaries++; });
  ws.on('close', () => log('ws closed'));
});
page.on('console', m => { if (m.type() === 'error') log('console.error', m.text().slice(0, 200)); });
const has = (type, pred = () => true, from = 0) => recv.slice(from).some(m => m.type === type && pred(m));
const until = async (what, fn, ms = 90000) => { const t = Date.now(); while (!(await fn())) { if (Date.now() - t > ms) throw new Error('timeout: ' + what); await page.waitForTimeout(100); } log('ok:', what); };
const liveBuffered = () => page.evaluate(() => { const v = [...document.querySelectorAll('video')].find(v => !v.classList.contains('hidden')); return v && v.buffered.length ? v.buffered.end(v.buffered.length - 1) : 0; });
const enabled = () => page.evaluate(() => !document.querySelector('#continuation-prompt')?.disabled);
try {
  await page.goto(CLIENT + '/');
  const box = page.getByLabel('Continuation prompt');
  // 1. custom-prompt start
  await box.fill('a red fox walking through a snowy forest');
  await page.getByRole('button', { name: /^generate$/i }).click();
  await until('first media_init', async () => has('media_init'));
  await until('video buffered > 0.5 s', async () => (await liveBuffered()) > 0.5);
  await until('composer enabled', enabled);
  // 2. the composer's rewrite
  let mark = recv.length;
  await box.fill('the fox starts to run');
  await page.getByRole('button', { name: 'Rewrite rollout' }).click();
  await until('rewrite complete', async () => has('rewrite_seed_prompts_complete', () => true, mark));
  await until('new rollout streaming', async () => has('media_init', m => true, recv.findIndex((m, i) => i >= mark && m.type === 'ltx2_stream_start')));
  await until('composer enabled again', enabled);
  await page.screenshot({ path: `${SHOTS}/dreamverse_after_rewrite.png` });
  // 3. New project (sidebar)
  mark = recv.length;
  await page.getByRole('button', { name: 'Toggle sidebar' }).click();
  await page.getByRole('button', { name: /^new project$/i }).first().click();
  await until('project_idle', async () => has('project_idle', () => true, mark));
  await until('page back in the lobby (Generate shown)', async () => (await page.getByRole('button', { name: /^generate$/i }).count()) > 0, 30000);
  // ... a second project on the same socket
  mark = recv.length;
  await box.fill('a lighthouse on a cliff at night');
  await page.getByRole('button', { name: /^generate$/i }).click();
  await until('second project streaming', async () => has('media_init', () => true, mark));
  await until('video buffered again', async () => (await liveBuffered()) > 0.5);
  // the segment cap (3 on this server): the rollout completes, the clip is saved
  await until('ltx2_stream_complete at the cap', async () => has('ltx2_stream_complete', () => true, mark), 120000);
  await page.waitForTimeout(2500);
  await page.screenshot({ path: `${SHOTS}/dreamverse_at_cap.png` });
  log('buttons now:', JSON.stringify(await page.evaluate(() => [...document.querySelectorAll('button')].map(b => b.getAttribute('aria-label') || b.textContent.trim()).filter(Boolean))));
  // 4. leave
  await page.getByRole('button', { name: 'Leave', exact: true }).click();
  await page.waitForTimeout(1000);
  const inModal = page.getByRole('dialog').getByRole('button', { name: /leave/i });
  if (await inModal.count()) { log('leave modal: confirming'); await inModal.first().click(); }
  await page.waitForTimeout(1500);
  const st = await (await fetch(SERVER + '/status')).json();
  log('sessions on the server after leaving:', st.sessions);
  if (st.sessions !== 0) throw new Error('the session outlived its socket');
} catch (e) {
  failed = true;
  log('FAILED:', e.message);
  await page.screenshot({ path: `${SHOTS}/dreamverse_failure.png` });
} finally {
  const errs = recv.filter(m => m.type === 'error');
  log('sent types:', [...new Set(sent.map(m => m.type))].join(','));
  log('errors received:', JSON.stringify(errs));
  log('binary frames:', binaries);
  await browser.close();
  if (failed || errs.length) process.exit(1);
}
