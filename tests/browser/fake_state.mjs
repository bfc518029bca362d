// A fake `colony monitor` state for trying the page and check_monitor.mjs without a swarm.
//
//   node tests/browser/fake_state.mjs --dir DIR [--kill PEER[,PEER...]] [--hostile]
//
// Writes DIR/api/v1/state every second (atomically) with one healthy model of 4 blocks held by
// 4 servers (0:2 twice, 2:4 twice) and one training run whose epoch and loss history grow. A
// --kill'ed server is shown "unreachable" and leaves the coverage. --hostile adds a second model
// whose strings are HTML/script (the page must show them as text). Serve DIR with any static
// server (e.g. python3 -m http.server), with DIR/index.html and DIR/static/dygraph.min.{js,css}.
// Prints the servers' peer ids as one JSON line on start.
import fs from 'node:fs';
import path from 'node:path';

const args = process.argv.slice(2);
function opt(name, dflt) {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
}
const dir = opt('--dir');
if (!dir) {
  console.error('usage: node fake_state.mjs --dir DIR [--kill PEER[,PEER...]] [--hostile]');
  process.exit(2);
}
const killed = new Set((opt('--kill', '') || '').split(',').filter(Boolean));
const hostile = args.includes('--hostile');

const B58 = '123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz';
function peerId(seed) {
  let s = 'A' + seed, x = 0;
  for (const ch of s) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  let out = '12D3KooW';
  for (let i = 0; i < 44; i++) { x = (x * 1103515245 + 12345) >>> 0; out += B58[(x >>> 8) % 58]; }
  return out;
}

const servers = [
  { peer: peerId('s1'), start: 0, end: 2 },
  { peer: peerId('s2'), start: 2, end: 4 },
  { peer: peerId('s3'), start: 0, end: 2 },
  { peer: peerId('s4'), start: 2, end: 4 },
];
const trainers = [peerId('t1'), peerId('t2'), peerId('t3')];
const monitor = peerId('monitor');
const started = Date.now() / 1000;
const history = [];

console.log(JSON.stringify({ servers: servers.map(s => `${s.peer}:${s.start}:${s.end}`), trainers, monitor }));

function modelState(name, numBlocks, list) {
  const coverage = Array(numBlocks).fill(0);
  for (const s of list) if (s.state === 'online') for (let b = s.start; b < s.end; b++) coverage[b]++;
  return {
    name, num_blocks: numBlocks,
    healthy: coverage.every(c => c >= 1),
    coverage,
    min_coverage: Math.min(...coverage), max_coverage: Math.max(...coverage),
    servers: list,
  };
}

function write() {
  const now = Date.now() / 1000;
  const t = now - started;
  const epoch = 10 + Math.floor(t / 3);
  const loss = 4.8 * Math.exp(-t / 120) + 0.6 + 0.05 * Math.sin(t);
  history.push([now, epoch, history.length % 7 === 3 ? null : loss]);
  if (history.length > 720) history.shift();

  const list = servers.map((s, i) => {
    const dead = killed.has(s.peer);
    const next = servers.filter(o => o.start === s.end && !killed.has(o.peer));
    return {
      peer: s.peer, state: dead ? 'unreachable' : 'online', start: s.start, end: s.end,
      throughput: 1530.2 - 100 * i, inference_rps: 40.1 + i, cache_tokens_left: 32768 - 1024 * i,
      version: '0.1.0', dtype: 'float32', relay: i === 3,
      addresses: i === 3 ? [`/ip4/10.0.0.9/tcp/31400/p2p/${peerId('relay')}/p2p-circuit/p2p/${s.peer}`]
                         : [`/ip4/10.0.0.${i + 1}/tcp/3140${i}/p2p/${s.peer}`],
      rtt_ms: dead ? null : 0.3 + 0.1 * i,
      next_pings: Object.fromEntries(next.map((o, j) => [o.peer, 0.5 + 0.1 * j])),
    };
  });
  const models = [modelState('llama-tiny', 4, list)];
  if (hostile) {
    const evil = '<img src=x onerror="document.title=\'pwned\'">';
    models.push(modelState(`<b>bold</b>${evil}`, 8, [
      { peer: `<script>document.title='pwned'</script>`, state: 'online', start: 0, end: 3,
        throughput: 12.5, inference_rps: 1.5, cache_tokens_left: 1000, version: evil, dtype: '<i>bf16</i>',
        relay: false, addresses: [], rtt_ms: 1.2, next_pings: { [evil]: 2.5 } },
      { peer: peerId('j1'), state: 'joining', start: 3, end: 5, throughput: 0, inference_rps: 0,
        cache_tokens_left: 0, version: '0.1.0', dtype: 'bfloat16', relay: false, addresses: [],
        rtt_ms: 3.4, next_pings: {} },
      { peer: peerId('o1'), state: 'offline', start: 5, end: 8, throughput: 800, inference_rps: 9,
        cache_tokens_left: 4096, version: '0.0.9', dtype: 'bfloat16', relay: false, addresses: [],
        rtt_ms: null, next_pings: {} },
    ]));
  }
  const state = {
    version: '0.1.0',
    updated_at: now,
    refresh_seconds: 1.0,
    monitor_peer: monitor,
    models,
    runs: [{
      run: hostile ? 'run1<script>x</script>' : 'run1',
      epoch,
      target_batch_size: 256,
      samples_per_second: 610.5 + 10 * Math.sin(t),
      loss,
      num_peers: trainers.length,
      peers: trainers.map((p, i) => ({
        peer: p, epoch: i === 2 ? epoch - 1 : epoch, samples_per_second: 153.1 + i,
        mode: i === 2 ? 'client' : 'trainer', phase: ['train', 'round', 'wait'][i],
        loss: i === 1 ? null : loss + 0.01 * i, version: '0.1.0',
      })),
      history,
      rounds: [epoch - 1, epoch - 2].filter(e => e >= 10).map(e => ({
        epoch: e,
        groups: [{ size: 2, ok: true, peers: [trainers[0], trainers[1]] },
                 { size: 1, ok: e % 2 === 0, peers: [trainers[2]] }],
      })),
    }],
    dht: {
      peers_known: 7,
      peers: [...servers.map(s => s.peer), trainers[0], peerId('x')].map((p, i) => ({
        peer: p, addresses: [`/ip4/10.0.0.${i + 1}/tcp/3140${i}`, `/ip6/::1/tcp/3140${i}`],
        reachable: killed.has(p) ? false : i === 5 ? null : true,
        rtt_ms: killed.has(p) || i === 5 ? null : 0.2 + i / 10,
        checked_at: i === 5 ? null : now - i,
      })),
    },
  };
  const file = path.join(dir, 'api', 'v1', 'state');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file + '.tmp', JSON.stringify(state));
  fs.renameSync(file + '.tmp', file);
}

write();
setInterval(write, 1000);
