#!/usr/bin/env node
// Checks what a person sees on the `colony monitor` page, in Debian's chromium driven by
// playwright-core. See usage() below. Exit status: 0 every check passed, 1 a check failed (one
// line per failure on stderr), 2 bad usage. One JSON line on stdout says what the page showed.
import { chromium } from 'playwright-core';

const USAGE = `usage:
  node tests/browser/check_monitor.mjs --url URL --phase healthy --model NAME --num-blocks N
       --server PEER:START:END [--server ...] --run RUN [common options]
  node tests/browser/check_monitor.mjs --url URL --phase killed --model NAME --num-blocks N
       --killed PEER --coverage C0,C1,... [common options]
common options:
  --timeout-ms T        bound on every wait, and on the whole check once chromium runs (default 30000)
  --screenshot PATH     full-page screenshot (PATH with .failed.png instead when a check fails)
  --chromium PATH       the browser (default /usr/bin/chromium)
  --viewport WxH        window size (default 1280x900)
  --interval-ms MS      how often the page is polled (default 100)`;

class UsageError extends Error {}

function parseArgs(argv) {
  const o = { servers: [], timeoutMs: 30000, chromium: '/usr/bin/chromium', viewport: [1280, 900], intervalMs: 100 };
  const int = (name, v, min) => {
    if (!/^\d+$/.test(v ?? '') || Number(v) < min) throw new UsageError(`${name} needs an integer >= ${min}, got ${JSON.stringify(v)}`);
    return Number(v);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') return { help: true };
    if (!a.startsWith('--')) throw new UsageError(`unexpected argument ${JSON.stringify(a)}`);
    const v = argv[i + 1];
    if (v === undefined) throw new UsageError(`${a} needs a value`);
    i++;
    switch (a) {
      case '--url': o.url = v; break;
      case '--phase':
        if (v !== 'healthy' && v !== 'killed') throw new UsageError(`--phase is healthy or killed, got ${JSON.stringify(v)}`);
        o.phase = v; break;
      case '--model': o.model = v; break;
      case '--num-blocks': o.numBlocks = int(a, v, 1); break;
      case '--server': {
        const m = /^(.+):(\d+):(\d+)$/.exec(v);
        if (!m) throw new UsageError(`--server is PEER:START:END, got ${JSON.stringify(v)}`);
        o.servers.push({ peer: m[1], start: Number(m[2]), end: Number(m[3]) });
        break;
      }
      case '--run': o.run = v; break;
      case '--killed': o.killed = v; break;
      case '--coverage':
        if (!/^\d+(,\d+)*$/.test(v)) throw new UsageError(`--coverage is C0,C1,... (integers), got ${JSON.stringify(v)}`);
        o.coverage = v.split(',').map(Number); break;
      case '--timeout-ms': o.timeoutMs = int(a, v, 1); break;
      case '--screenshot': o.screenshot = v; break;
      case '--chromium': o.chromium = v; break;
      case '--viewport': {
        const m = /^(\d+)x(\d+)$/.exec(v);
        if (!m) throw new UsageError(`--viewport is WxH, got ${JSON.stringify(v)}`);
        o.viewport = [Number(m[1]), Number(m[2])]; break;
      }
      case '--interval-ms': o.intervalMs = int(a, v, 10); break;
      default: throw new UsageError(`unknown option ${a}`);
    }
  }
  const need = (cond, what) => { if (!cond) throw new UsageError(what); };
  need(o.url, '--url is required');
  need(o.phase, '--phase is required');
  need(o.model !== undefined, '--model is required');
  need(o.numBlocks !== undefined, '--num-blocks is required');
  if (o.phase === 'healthy') {
    need(o.servers.length > 0, '--phase healthy needs at least one --server PEER:START:END');
    need(o.run !== undefined, '--phase healthy needs --run');
    need(o.killed === undefined && o.coverage === undefined, '--killed and --coverage belong to --phase killed');
    for (const s of o.servers) {
      need(s.start < s.end && s.end <= o.numBlocks, `--server ${s.peer}:${s.start}:${s.end} is not a block range of 0:${o.numBlocks}`);
    }
  } else {
    need(o.killed !== undefined, '--phase killed needs --killed PEER');
    need(o.coverage !== undefined, '--phase killed needs --coverage C0,C1,...');
    need(o.coverage.length === o.numBlocks, `--coverage has ${o.coverage.length} numbers, --num-blocks says ${o.numBlocks}`);
    need(o.servers.length === 0 && o.run === undefined, '--server and --run belong to --phase healthy');
  }
  return o;
}

// Runs in the page: what is shown for the model, its server rows and the run (visible text only).
function snapshot(arg) {
  const visible = (e) => !!e && (typeof e.checkVisibility === 'function'
    ? e.checkVisibility({ checkOpacity: true, checkVisibilityCSS: true }) : e.getClientRects().length > 0);
  const text = (e) => (e && visible(e) ? (e.innerText ?? e.textContent ?? '').replace(/\s+/g, ' ').trim() : null);
  const byAttr = (root, attr, value) =>
    Array.from(root.querySelectorAll(`[${attr}]`)).filter((e) => e.getAttribute(attr) === value);
  const out = { model: null, run: null };
  const updated = document.getElementById('updated');
  out.updated = text(updated);
  out.updated_at = updated ? updated.getAttribute('data-updated-at') : null;
  const banner = document.getElementById('error');
  out.error_banner = banner ? text(banner) : null;

  const models = byAttr(document, 'data-model', arg.model);
  if (models.length) {
    const m = models[0];
    const blocks = Array.from(m.querySelectorAll('[data-block]')).map((b) => ({
      index: b.getAttribute('data-block'), text: text(b),
    }));
    const servers = {};
    for (const row of m.querySelectorAll('[data-peer]')) {
      const peer = row.getAttribute('data-peer');
      if (peer in servers) { servers[peer].duplicate = true; continue; }
      const stateCell = row.querySelector('.state');
      servers[peer] = {
        visible: visible(row),
        data_state: row.getAttribute('data-state'),
        state: stateCell ? text(stateCell) : null,
        blocks: text(row.querySelector('.blocks')),
      };
    }
    out.model = {
      count: models.length, visible: visible(m), healthy: m.getAttribute('data-healthy'),
      badge: text(m.querySelector('.health')), blocks, servers,
    };
  }
  if (arg.run !== undefined) {
    const runs = byAttr(document, 'data-run', arg.run);
    if (runs.length) {
      const r = runs[0];
      const chart = r.querySelector('.loss-chart');
      const canvas = chart ? Array.from(chart.querySelectorAll('canvas')).find((c) => visible(c) && c.width > 0 && c.height > 0) : null;
      out.run = {
        count: runs.length, visible: visible(r), epoch: text(r.querySelector('.epoch')),
        chart: !!chart, chart_visible: visible(chart),
        points: chart ? chart.getAttribute('data-points') : null,
        canvas: !!canvas,
      };
    }
  }
  return out;
}

const isCount = (s) => typeof s === 'string' && /^\d+$/.test(s);

// Failures of the model checks common to both phases: the section, N cells with the given coverage,
// and a badge consistent with it.
function checkModel(o, snap, coverage) {
  const f = [];
  const m = snap.model;
  if (!m) return { failures: [`model "${o.model}": no element with data-model="${o.model}" on the page`], shown: [] };
  if (m.count > 1) f.push(`model "${o.model}": ${m.count} sections with data-model="${o.model}"`);
  if (!m.visible) f.push(`model "${o.model}": its section is not visible`);
  const shown = m.blocks.map((b) => b.text);
  if (m.blocks.length !== o.numBlocks) {
    f.push(`model "${o.model}": ${m.blocks.length} block cells shown, expected ${o.numBlocks}`);
  } else {
    m.blocks.forEach((b, i) => {
      if (b.index !== String(i)) f.push(`model "${o.model}": block cell #${i} has data-block="${b.index}"`);
      else if (b.text === null) f.push(`model "${o.model}": block ${i} is not visible`);
      else if (!isCount(b.text)) f.push(`model "${o.model}": block ${i} shows "${b.text}", not a coverage number`);
      else if (Number(b.text) !== coverage[i]) f.push(`model "${o.model}": block ${i} shows coverage ${b.text}, expected ${coverage[i]}`);
    });
  }
  const missing = coverage.filter((c) => c < 1).length;
  if (missing === 0) {
    if (m.badge !== 'usable end to end') f.push(`model "${o.model}": health badge shows ${JSON.stringify(m.badge)}, expected "usable end to end"`);
    if (m.healthy !== 'true') f.push(`model "${o.model}": data-healthy="${m.healthy}", expected "true"`);
  } else {
    const b = /^not usable: (\d+) blocks? without a server$/.exec(m.badge ?? '');
    if (!b) f.push(`model "${o.model}": health badge shows ${JSON.stringify(m.badge)}, expected "not usable: ${missing} blocks without a server"`);
    else if (Number(b[1]) !== missing) f.push(`model "${o.model}": health badge counts ${b[1]} blocks without a server, expected ${missing}`);
    if (m.healthy !== 'false') f.push(`model "${o.model}": data-healthy="${m.healthy}", expected "false"`);
  }
  return { failures: f, shown };
}

function short(peer) { return peer.length > 16 ? `${peer.slice(0, 8)}…${peer.slice(-6)}` : peer; }

async function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`check_monitor: ${e.message}\n${USAGE}\n`);
    return 2;
  }
  if (o.help) { process.stdout.write(`${USAGE}\n`); return 0; }

  const t0 = Date.now();
  // Chromium's start is bounded by T on its own; T then bounds the checks from the page's load on.
  let deadline = t0 + o.timeoutMs;
  const left = () => Math.max(1, deadline - Date.now());
  const seen = { phase: o.phase, url: o.url, ok: false };
  const pageErrors = [];
  const consoleErrors = [];
  let failures = [];
  let browser = null;
  let page = null;

  // A last resort if something hangs past every bound: report and leave.
  const guard = setTimeout(() => {
    process.stderr.write(`FAIL: the check did not finish within ${2 * o.timeoutMs + 60000} ms\n`);
    process.exit(1);
  }, 2 * o.timeoutMs + 60000);
  guard.unref();

  const expected = (() => {
    if (o.phase === 'killed') return o.coverage;
    const c = Array(o.numBlocks).fill(0);
    for (const s of o.servers) for (let b = s.start; b < s.end; b++) c[b]++;
    return c;
  })();

  try {
    try {
      browser = await chromium.launch({
        executablePath: o.chromium,
        headless: true,
        timeout: left(),
        args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
               '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
      });
    } catch (e) {
      failures.push(`chromium (${o.chromium}) failed to start: ${oneLine(e)}`);
      return await finish();
    }
    deadline = Date.now() + o.timeoutMs;
    const context = await browser.newContext({ viewport: { width: o.viewport[0], height: o.viewport[1] } });
    page = await context.newPage();
    page.on('pageerror', (e) => pageErrors.push(oneLine(e)));
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text().slice(0, 300)); });

    const navStart = Date.now();
    try {
      const res = await page.goto(o.url, { waitUntil: 'domcontentloaded', timeout: left() });
      if (res && !res.ok()) failures.push(`GET ${o.url} answered HTTP ${res.status()}`);
    } catch (e) {
      failures.push(`could not load ${o.url}: ${oneLine(e)}`);
      return await finish();
    }
    if (failures.length) return await finish();

    const arg = { model: o.model, run: o.phase === 'healthy' ? o.run : undefined };
    const look = async () => {
      try { return await page.evaluate(snapshot, arg); } catch (e) { return { evaluate_error: oneLine(e) }; }
    };
    // Polls until cond(snap) gives no failures; returns [snap, failures] of the last look.
    const waitFor = async (cond) => {
      for (;;) {
        const snap = await look();
        const f = snap.evaluate_error ? [`could not read the page: ${snap.evaluate_error}`] : cond(snap);
        if (f.length === 0 || Date.now() >= deadline) return [snap, f];
        await page.waitForTimeout(Math.min(o.intervalMs, left()));
      }
    };

    if (o.phase === 'healthy') {
      const epochs = [];
      const noteEpoch = (snap) => {
        const e = snap.run && isCount(snap.run.epoch) ? Number(snap.run.epoch) : null;
        if (e !== null && epochs[epochs.length - 1] !== e) epochs.push(e);
      };
      seen.epochs_seen = epochs;
      // 1. The model usable end to end with the given servers, and the run with a numeric epoch.
      let [snap, f] = await waitFor((s) => {
        noteEpoch(s);
        const f = [...checkModel(o, s, expected).failures];
        const servers = s.model ? s.model.servers : {};
        for (const sv of o.servers) {
          const row = servers[sv.peer];
          const who = `server ${short(sv.peer)}`;
          if (!row) { if (s.model) f.push(`${who}: no row with data-peer in model "${o.model}"`); continue; }
          if (!row.visible) f.push(`${who}: its row is not visible`);
          if (row.state !== 'online') f.push(`${who}: state shows ${JSON.stringify(row.state)}, expected "online"`);
          if (row.data_state !== 'online') f.push(`${who}: data-state="${row.data_state}", expected "online"`);
          if (row.blocks !== `${sv.start}:${sv.end}`) f.push(`${who}: blocks show ${JSON.stringify(row.blocks)}, expected "${sv.start}:${sv.end}"`);
        }
        if (expected.some((c) => c < 1)) f.push(`the given servers leave blocks uncovered (${expected.join(',')}); --phase healthy expects every block covered`);
        if (!s.run) f.push(`run "${o.run}": no element with data-run="${o.run}" on the page`);
        else {
          if (!s.run.visible) f.push(`run "${o.run}": its section is not visible`);
          if (!isCount(s.run.epoch)) f.push(`run "${o.run}": epoch shows ${JSON.stringify(s.run.epoch)}, not a number`);
        }
        return f;
      });
      record(snap);
      if (f.length) { failures.push(...f); seen.stage = 'model and run shown'; return await finish(); }
      const first = Number(snap.run.epoch);
      seen.first_epoch = first;
      seen.shown_ms = Date.now() - navStart;
      // 2. The epoch moves on, and the loss chart has drawn at least 2 points.
      [snap, f] = await waitFor((s) => {
        noteEpoch(s);
        const f = [];
        if (!s.run) return [`run "${o.run}": its section went away`];
        if (!isCount(s.run.epoch) || Number(s.run.epoch) <= first) f.push(`run "${o.run}": epoch did not increase from ${first} (shows ${JSON.stringify(s.run.epoch)})`);
        if (!s.run.chart) f.push(`run "${o.run}": no .loss-chart element`);
        else {
          if (!s.run.chart_visible) f.push(`run "${o.run}": the loss chart is not visible`);
          if (!isCount(s.run.points) || Number(s.run.points) < 2) f.push(`run "${o.run}": loss chart has data-points=${JSON.stringify(s.run.points)}, expected >= 2`);
          if (!s.run.canvas) f.push(`run "${o.run}": the loss chart has no drawn canvas`);
        }
        return f;
      });
      record(snap);
      if (f.length) { failures.push(...f); seen.stage = 'epoch increases, chart drawn'; return await finish(); }
      seen.elapsed_ms = Date.now() - navStart;
    } else {
      const [snap, f] = await waitFor((s) => {
        const f = [...checkModel(o, s, expected).failures];
        const row = s.model ? s.model.servers[o.killed] : null;
        const who = `killed server ${short(o.killed)}`;
        if (s.model && !row) f.push(`${who}: no row with data-peer in model "${o.model}"`);
        if (row) {
          if (!row.visible) f.push(`${who}: its row is not visible`);
          if (row.state !== 'offline' && row.state !== 'unreachable') f.push(`${who}: state shows ${JSON.stringify(row.state)}, expected "offline" or "unreachable"`);
          if (row.data_state !== row.state) f.push(`${who}: data-state="${row.data_state}" differs from the state shown (${JSON.stringify(row.state)})`);
        }
        return f;
      });
      record(snap);
      if (f.length) { failures.push(...f); return await finish(); }
      seen.elapsed_ms = Date.now() - navStart;
      seen.held_at_ms = Date.now();  // wall clock, for the caller's time since the kill
    }
    return await finish();
  } catch (e) {
    failures.push(`unexpected error: ${oneLine(e)}`);
    return await finish();
  } finally {
    if (browser) await browser.close().catch(() => {});
  }

  function record(snap) {
    if (snap.model) {
      seen.coverage = snap.model.blocks.map((b) => (isCount(b.text) ? Number(b.text) : b.text));
      seen.badge = snap.model.badge;
      seen.healthy = snap.model.healthy;
      seen.states = Object.fromEntries(Object.entries(snap.model.servers).map(([p, r]) => [p, r.state]));
      seen.blocks = Object.fromEntries(Object.entries(snap.model.servers).map(([p, r]) => [p, r.blocks]));
    }
    if (snap.run) {
      seen.epoch = snap.run.epoch;
      seen.points = isCount(snap.run.points) ? Number(snap.run.points) : snap.run.points;
      seen.canvas = snap.run.canvas;
    }
    seen.updated = snap.updated;
    seen.updated_at = snap.updated_at;
    if (snap.error_banner) seen.error_banner = snap.error_banner;
  }

  async function finish() {
    for (const e of pageErrors) failures.push(`page script error: ${e}`);
    if (consoleErrors.length) seen.console_errors = consoleErrors.slice(0, 10);
    if (o.phase === 'killed' || o.phase === 'healthy') seen.expected_coverage = expected;
    if (o.screenshot && page) {
      const path = failures.length ? o.screenshot.replace(/(\.png)?$/i, '.failed.png') : o.screenshot;
      try {
        await page.screenshot({ path, fullPage: true, timeout: Math.min(o.timeoutMs, 30000) });
        seen.screenshot = path;
      } catch (e) {
        failures.push(`could not take the screenshot ${path}: ${oneLine(e)}`);
      }
    }
    seen.ok = failures.length === 0;
    if (!seen.ok && o.phase) seen.failures = failures;
    seen.total_ms = Date.now() - t0;
    process.stdout.write(`${JSON.stringify(seen)}\n`);
    if (failures.length) {
      const header = Date.now() >= deadline ? `check_monitor: ${o.phase}: not seen within ${o.timeoutMs} ms:\n` : `check_monitor: ${o.phase}: failed:\n`;
      process.stderr.write(header + failures.map((f) => `FAIL: ${f}\n`).join(''));
      return 1;
    }
    return 0;
  }
}

function oneLine(e) {
  const s = e && e.message ? e.message : String(e);
  return s.replace(/\x1b\[[0-9;]*m/g, '').split('\n').map((l) => l.trim()).filter(Boolean).join(' | ').slice(0, 1500);
}

main().then((code) => process.exit(code), (e) => {
  process.stderr.write(`FAIL: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
