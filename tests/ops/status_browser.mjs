// /status in a real browser (run by tests/ops/status_browser.sh): headless
// Chromium, driven by playwright-core, loads the page of a gateway with two
// routes and checks what a person sees there. Arguments: the page's URL, the
// gateway's version, Chromium's path, the directory playwright-core is
// installed in, and where to leave a screenshot.
import { createRequire } from 'node:module';

const [url, version, executablePath, playwrightDir, screenshot] = process.argv.slice(2);
const require = createRequire(`${playwrightDir}/`);
const { chromium } = require('playwright-core');

const failures = [];
const check = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};

const browser = await chromium.launch({ executablePath, headless: true });
try {
  const page = await browser.newPage();
  const requested = [];
  page.on('request', (r) => requested.push(r.url()));
  const complaints = [];
  page.on('console', (m) => complaints.push(`console ${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => complaints.push(`page error: ${e.message}`));

  const answer = await page.goto(url, { waitUntil: 'load' });
  check(answer.status() === 200, `GET ${url} answered ${answer.status()}`);
  await page.screenshot({ path: screenshot, fullPage: true });

  const title = await page.title();
  check(title === `sessionless ${version} status`, `the title names the version: "${title}"`);
  const shownVersion = await page.locator('#version').innerText();
  check(shownVersion === version, `the heading shows version ${version}: "${shownVersion}"`);

  const routes = await page.locator('article.route').evaluateAll((els) => els.map((e) => e.dataset.route));
  check(routes.length === 2 && routes.includes('/up') && routes.includes('/down'), `both routes are listed: ${routes}`);
  check(await page.getByRole('heading', { name: '/up' }).isVisible(), 'the /up route has a visible heading');
  check(await page.getByRole('heading', { name: '/down' }).isVisible(), 'the /down route has a visible heading');

  const row = (route) => page.locator(`article.route[data-route="${route}"] tr.upstream`);
  const cell = async (route, column) => (await row(route).locator(`td.${column}`).innerText()).trim();
  check((await row('/up').count()) === 1 && (await row('/down').count()) === 1, 'one upstream row per route');
  const upState = await cell('/up', 'state');
  const downState = await cell('/down', 'state');
  check(upState === 'up', `the /up route's upstream shows up: "${upState}"`);
  check(downState.startsWith('down'), `the /down route's upstream shows down: "${downState}"`);
  const upGeneration = await cell('/up', 'generation');
  const downGeneration = await cell('/down', 'generation');
  check(upGeneration.startsWith('legacy'), `the up upstream's generation was probed: "${upGeneration}"`);
  check(downGeneration.startsWith('unknown'), `the down upstream's generation is unknown: "${downGeneration}"`);
  const upInstances = await row('/up').locator('td').nth(4).innerText();
  const downInstances = await row('/down').locator('td').nth(4).innerText();
  check(upInstances.startsWith('1 up, 0 down'), `instances of /up: "${upInstances.split('\n')[0]}"`);
  check(downInstances.startsWith('0 up, 1 down'), `instances of /down: "${downInstances.split('\n')[0]}"`);

  // The inline style applies (the CSP lets it), and tells up from down by colour.
  const colour = (route) =>
    row(route).locator('td.state').evaluate((td) => getComputedStyle(td).color);
  const [upColour, downColour] = [await colour('/up'), await colour('/down')];
  check(upColour === 'rgb(23, 111, 44)' && downColour === 'rgb(176, 0, 32)', `state colours: ${upColour}, ${downColour}`);

  const generation = await page.locator('#config-generation').innerText();
  check(generation === '1', `the config generation is 1: "${generation}"`);
  const lastReload = await page.locator('#last-reload').innerText();
  check(lastReload === 'none since start', `no reload yet: "${lastReload}"`);
  const listener = await page.locator('dd.listener').first().innerText();
  check(url.startsWith(listener), `the public listener is the page's origin: "${listener}"`);

  check((await page.locator('script').count()) === 0, 'the page has no script');
  check(requested.length === 1 && requested[0] === url, `the page fetched nothing else: ${requested}`);
  check(complaints.length === 0, `no console message or page error: ${complaints}`);
} finally {
  await browser.close();
}

if (failures.length > 0) {
  console.error(`status_browser.mjs: ${failures.length} check(s) failed`);
  process.exit(1);
}
console.log('status_browser.mjs: every check passed');
