// test/integration/fixture.ts — real provider-sim and idemd processes on loopback (port 0), each
// in a fresh temporary directory with its own SQLite file, stopped by PID.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ALICE = "dev-acme-alice-7f3c9a1e";
export const BOB = "dev-acme-bob-2b8d4e6f";

const here = dirname(fileURLToPath(import.meta.url));
/** The package folder (this file runs from build/test/integration/). */
export const PACKAGE_DIR = resolve(here, "../../..");
export const IDEM_BIN = resolve(PACKAGE_DIR, process.env.IDEM_BIN ?? "../../build/ci");
export const IDEMD = join(IDEM_BIN, "server/idemd");
export const PROVIDER_SIM = join(IDEM_BIN, "tools/provider-sim");

/** Throws (failing the suite, not skipping it) when the binaries are missing. */
export function requireBinaries(): void {
  for (const p of [IDEMD, PROVIDER_SIM]) {
    if (!existsSync(p)) throw new Error(`missing ${p}: set IDEM_BIN to a build with server/idemd and tools/provider-sim`);
  }
}

const running = new Set<ChildProcess>();
function killAll(): void {
  for (const c of running) {
    if (c.pid !== undefined && c.exitCode === null && c.signalCode === null) {
      try { process.kill(c.pid, "SIGKILL"); } catch { /* already gone */ }
    }
  }
}
process.on("exit", killAll);
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.on(sig, () => { killAll(); process.exit(1); });
}

export interface Service {
  child: ChildProcess;
  url: string;
  /** SIGKILL by PID and wait for the exit. */
  kill(): Promise<void>;
}

/** Spawns `argv` in `cwd`, waits for "<name> listening on URL" on its output. */
export async function startService(argv: string[], name: string, cwd: string,
                                   env: Record<string, string> = {}): Promise<Service> {
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"],
  });
  running.add(child);
  const exited = new Promise<void>((res) => child.once("exit", () => { running.delete(child); res(); }));
  const kill = async () => {
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      try { process.kill(child.pid, "SIGKILL"); } catch { /* gone */ }
    }
    await exited;
  };
  let output = "";
  const url = await new Promise<string>((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`${name} did not start in 10 s:\n${output}`)), 10_000);
    const onData = (d: Buffer) => {
      output += d.toString();
      if (output.length > 65536) output = output.slice(-65536);
      const m = new RegExp(`${name} listening on (http://127\\.0\\.0\\.1:[0-9]+)`).exec(output);
      if (m) { clearTimeout(timer); res(m[1]!); }
    };
    child.stdout!.on("data", onData);
    child.stderr!.on("data", onData);
    child.once("exit", (code, sig) => { clearTimeout(timer); rej(new Error(`${name} exited (${code ?? sig}):\n${output}`)); });
  });
  return { child, url, kill };
}

export interface IdemdOptions {
  providerTimeoutMs?: number;
  leaseMs?: number;
  extraProvider?: string;
  extraIdempotency?: string;
}

const SECRETS = `hmac_current = 1\nseal_current = 1\n[[hmac]]\nid = 1\nkey = "${"a".repeat(64)}"\n` +
  `[[seal]]\nid = 1\nkey = "${"b".repeat(64)}"\n`;

/** provider-sim and idemd for one test, in their own temporary directory. */
export class Stack {
  readonly dir: string;
  provider!: Service;
  idemd: Service | undefined;

  private constructor() {
    this.dir = mkdtempSync(join(tmpdir(), "idem-ts-"));
  }

  static async start(options: IdemdOptions = {}): Promise<Stack> {
    requireBinaries();
    const s = new Stack();
    try {
      s.provider = await startService([PROVIDER_SIM, "--listen", "127.0.0.1:0"], "provider-sim", s.dir);
      await s.startIdemd(options);
    } catch (e) {
      await s.stop();
      throw e;
    }
    return s;
  }

  get url(): string {
    if (!this.idemd) throw new Error("idemd is not running");
    return this.idemd.url;
  }

  async startIdemd(o: IdemdOptions = {}): Promise<void> {
    const providerTimeout = o.providerTimeoutMs ?? 1000;
    const lease = o.leaseMs ?? Math.max(3000, providerTimeout + 1000);
    const config = join(this.dir, "idemd.toml");
    writeFileSync(config, [
      `[server]`, `listen = "127.0.0.1:0"`, `read_timeout_ms = 2000`, `drain_timeout_ms = 5000`,
      `[store]`, `url = "sqlite://${join(this.dir, "idem.db")}"`,
      `[provider]`, `url = "${this.provider.url}"`, `timeout_ms = ${providerTimeout}`,
      `settle_ms = ${providerTimeout + 1000}`, o.extraProvider ?? "",
      `[idempotency]`, `lease_ms = ${lease}`, `lease_margin_ms = 500`, `reconcile_interval_ms = 600000`,
      o.extraIdempotency ?? "",
      `[[principals]]`, `api_key_sha256 = "86f71c9cb79152ae8c4aff86cd48dbfc35eee594762141f8f00ece58705547e5"`,
      `tenant = "acme"`, `user = "alice"`,
      `[[principals]]`, `api_key_sha256 = "a89d26c5dbc510aabe658da978bf458885cc3b2bc814256dd016fb3341ed9810"`,
      `tenant = "acme"`, `user = "bob"`, "",
    ].join("\n"));
    this.idemd = await startService([IDEMD, "--config", config], "idemd", this.dir, { IDEM_SECRETS: SECRETS });
  }

  async killIdemd(): Promise<void> {
    await this.idemd?.kill();
    this.idemd = undefined;
  }

  async stop(): Promise<void> {
    await this.idemd?.kill();
    await this.provider?.kill();
    if (!process.env.IDEM_KEEP_TMP) rmSync(this.dir, { recursive: true, force: true });
  }

  /** provider-sim: POST /admin/faults. */
  async fault(f: Record<string, unknown>): Promise<void> {
    const r = await fetch(`${this.provider.url}/admin/faults`, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(f),
    });
    if (r.status !== 200) throw new Error(`fault ${JSON.stringify(f)}: ${r.status} ${await r.text()}`);
  }

  async stats(): Promise<{ total: number; charges_by_reference: Record<string, number> }> {
    const r = await fetch(`${this.provider.url}/admin/stats`);
    return (await r.json()) as { total: number; charges_by_reference: Record<string, number> };
  }

  async totalCharges(): Promise<number> {
    return (await this.stats()).total;
  }

  async chargesFor(reference: string): Promise<number> {
    return (await this.stats()).charges_by_reference[reference] ?? 0;
  }
}

export function body(order: string, amount = "100.00", currency = "CNY") {
  return { merchant_order_no: order, amount, currency };
}
