/**
 * A lease: the proof of ownership that fences a worker (only the holder of a
 * key's current lease may complete or release it).
 *
 * Drawn by the service, 63 random bits, never from a database sequence:
 * - after an asynchronous failover, a sequence on the new primary can hand
 *   out numbers the old one already gave (their WAL was lost), so a worker
 *   from before the switch could complete a newer claim of the same key; a
 *   random value repeats with odds of 2^-63 per pair;
 * - a sequence writes WAL (one record per 32 values) and is one more shared
 *   hot spot; a distributed table (Citus) cannot call nextval() in a shard;
 * - the service knows the lease before the claim is answered, so a claim
 *   whose answer is lost can still be released or recognised (recoverable
 *   claims, http/idempotency.ts).
 * Positive and non-zero, so it fits PostgreSQL's bigint and reads well.
 */
export function newLeaseId(): string {
  const [value] = crypto.getRandomValues(new BigUint64Array(1))
  const lease = value! & 0x7fff_ffff_ffff_ffffn
  return lease === 0n ? '1' : lease.toString()
}
