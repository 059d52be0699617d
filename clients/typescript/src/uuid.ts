// src/uuid.ts — operation keys: UUIDv7 (RFC 9562 §5.7), time-ordered with 74 random bits.

/** Fills `bytes` with random bytes. The default is the platform's CSPRNG. */
export type RandomBytes = (bytes: Uint8Array) => void;

export const systemRandomBytes: RandomBytes = (bytes) => {
  globalThis.crypto.getRandomValues(bytes);
};

/**
 * A new UUIDv7 in its canonical lower-case form, e.g. `0190a6e2-7c3d-7b1e-9a4f-1c2d3e4f5a6b`:
 * bits 0..47 the Unix time in milliseconds (`nowMs`), then version 7, 12 random bits, variant
 * 0b10 and 62 random bits. It is 36 characters of `0-9 a-f -`, which idemd's default key policy
 * accepts.
 */
export function uuidv7(nowMs: number = Date.now(), randomBytes: RandomBytes = systemRandomBytes): string {
  const b = new Uint8Array(16);
  randomBytes(b.subarray(6));
  let ms = Math.max(0, Math.floor(nowMs));
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  b[6] = 0x70 | (b[6]! & 0x0f);
  b[8] = 0x80 | (b[8]! & 0x3f);
  let hex = "";
  for (const byte of b) hex += byte.toString(16).padStart(2, "0");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** The millisecond timestamp a UUIDv7 carries, or undefined if `key` is not a UUIDv7. */
export function uuidv7Time(key: string): number | undefined {
  if (!UUIDV7.test(key)) return undefined;
  return parseInt(key.slice(0, 8) + key.slice(9, 13), 16);
}

export const UUIDV7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
