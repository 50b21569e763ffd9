// verify.mjs verifies ticketd fences with nothing but Node.js's crypto,
// following docs/fencing.md step by step: the check that the documented
// format can be implemented outside Go. fence's tests run it.
//
// Usage: node verify.mjs CLUSTER_ID PUBLIC_KEY... < cases
// Each input line is a fence; each output line is a JSON verdict:
// {"ok":true,"cluster_id":"…","key":"…","token":"…","key_id":"…"} or
// {"ok":false,"code":"fence_…"}.
import { createHash, createPublicKey, verify } from 'node:crypto';
import { createInterface } from 'node:readline';

const MAX_LEN = 810;
const MAX_KEY_LEN = 512;
const FIXED = 1 + 8 + 8 + 8 + 2;
const CONTEXT = Buffer.from('ticketd-fence-v1\0', 'latin1');

// b64 decodes unpadded base64url, refusing any other character and any
// text that is not the canonical encoding of what it decodes to.
function b64(s) {
  if (!/^[A-Za-z0-9_-]*$/.test(s)) return null;
  const b = Buffer.from(s, 'base64url');
  return b.toString('base64url') === s ? b : null;
}

class Refused extends Error {
  constructor(code) { super(code); this.code = code; }
}

function trustedKeys(texts) {
  const keys = new Map();
  for (const t of texts) {
    const raw = t.startsWith('tfk1.') ? b64(t.slice(5)) : null;
    if (!raw || raw.length !== 32) throw new Error(`bad public key ${t}`);
    const id = createHash('sha256').update(raw).digest().subarray(0, 8).toString('hex');
    const key = createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') }, format: 'jwk' });
    keys.set(id, key);
  }
  return keys;
}

function verifyFence(fence, clusterID, keys) {
  // 1. Shape: at most 810 bytes, three dot-separated parts, "tf1" first.
  if (Buffer.byteLength(fence) > MAX_LEN) throw new Refused('fence_malformed');
  const parts = fence.split('.');
  if (parts.length < 2) throw new Refused('fence_malformed');
  if (parts[0] !== 'tf1') {
    throw new Refused(/^tf[0-9]{1,4}$/.test(parts[0]) ? 'fence_unsupported_version' : 'fence_malformed');
  }
  if (parts.length !== 3) throw new Refused('fence_malformed');
  const payload = b64(parts[1]);
  const sig = b64(parts[2]);
  if (!payload || !sig || sig.length !== 64) throw new Refused('fence_malformed');
  // 2. Payload: version, cluster ID, key ID, token, key length, key.
  if (payload.length < FIXED || payload[0] !== 1) throw new Refused('fence_malformed');
  const cluster = payload.subarray(1, 9).toString('hex');
  const keyID = payload.subarray(9, 17).toString('hex');
  const token = payload.readBigUInt64BE(17);
  const keyLen = payload.readUInt16BE(25);
  if (payload.length !== FIXED + keyLen || keyLen < 1 || keyLen > MAX_KEY_LEN || token === 0n) {
    throw new Refused('fence_malformed');
  }
  const keyBytes = payload.subarray(FIXED);
  let key;
  try {
    key = new TextDecoder('utf-8', { fatal: true }).decode(keyBytes);
  } catch {
    throw new Refused('fence_malformed');
  }
  if (keyBytes.includes(0)) throw new Refused('fence_malformed');
  // 3. The key ID must be a trusted key's.
  const pub = keys.get(keyID);
  if (!pub) throw new Refused('fence_unknown_key');
  // 4. The signature covers the context string and the payload.
  if (!verify(null, Buffer.concat([CONTEXT, payload]), pub, sig)) throw new Refused('fence_forged');
  // 5. Only then: the cluster.
  if (cluster !== clusterID) throw new Refused('fence_wrong_cluster');
  return { ok: true, cluster_id: cluster, key, token: token.toString(), key_id: keyID };
}

const [clusterID, ...pubkeys] = process.argv.slice(2);
const keys = trustedKeys(pubkeys);
for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  let verdict;
  try {
    verdict = verifyFence(line, clusterID, keys);
  } catch (e) {
    if (!(e instanceof Refused)) throw e;
    verdict = { ok: false, code: e.code };
  }
  console.log(JSON.stringify(verdict));
}
