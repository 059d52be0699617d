// examples/resume.ts — a payment that survives a restart of the process that makes it.
//
//   IDEM_URL=http://127.0.0.1:8080 IDEM_API_KEY=... node resume.js KEY_FILE ORDER AMOUNT CURRENCY
//
// The operation's key is written (and fsynced) to KEY_FILE before the first request leaves. A
// process killed mid-operation and started again finds the key there and sends the same request
// under it: idemd answers with the one payment (replayed), never a second charge. Prints one line
// of JSON: {"key","resumed","replayed","attempts","payment"}.

import { closeSync, existsSync, fsyncSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";

import { IdemClient, ProblemError } from "../src/index.js";  // in your code: "@idem/client"

function persist(file: string, key: string): void {
  const tmp = `${file}.tmp`;
  const fd = openSync(tmp, "w", 0o600);
  try {
    writeSync(fd, `${key}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);  // atomic: a crash leaves the old file or the new one, never half a key
}

async function main(): Promise<number> {
  const [keyFile, order, amount, currency] = process.argv.slice(2);
  if (!keyFile || !order || !amount || !currency) {
    console.error("usage: resume KEY_FILE ORDER AMOUNT CURRENCY");
    return 2;
  }
  const client = new IdemClient({
    baseUrl: process.env.IDEM_URL ?? "http://127.0.0.1:8080",
    apiKey: process.env.IDEM_API_KEY ?? "",
  });
  const resumed = existsSync(keyFile);
  const key = resumed ? readFileSync(keyFile, "utf8").trim() : client.newKey();
  try {
    const r = await client.createPayment(
      { merchant_order_no: order, amount, currency },
      { key, onKey: resumed ? undefined : (k) => persist(keyFile, k) },
    );
    console.log(JSON.stringify({ key, resumed, replayed: r.replayed, attempts: r.attempts, payment: r.body }));
    return 0;
  } catch (e) {
    if (e instanceof ProblemError) console.error(`${e.status} ${e.type}: ${e.detail}`);
    else console.error(String(e));
    return 1;
  }
}

process.exitCode = await main();
