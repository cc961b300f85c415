/** One key's state in words, for the page and the CLI alike (no markup). */
import { formatAge } from './format'
import { OWNER_ALIVE_SECONDS, type KeyDetail } from './show'

/** Who holds the key, and whether that process is alive. */
export function ownerText(detail: KeyDetail): string {
  const owner = detail.owner
  if (!owner) return detail.status === 'processing' ? 'unknown (claimed without a heartbeat): taken for alive until its deadline' : 'none (nobody holds the key)'
  if (owner.pid === null) return `process ${owner.id}: gone (no heartbeat row)`
  if (owner.stoppedAt !== null && !owner.alive) {
    const when = owner.heartbeatAgeSeconds === null ? '' : ` ${formatAge(owner.heartbeatAgeSeconds)} ago`
    return `pid ${owner.pid} on ${owner.hostname ?? '?'}: stopped${when} (shut down cleanly before this request finished)`
  }
  const beat = owner.heartbeatAgeSeconds === null ? '' : `, last heartbeat ${formatAge(owner.heartbeatAgeSeconds)} ago`
  return `pid ${owner.pid} on ${owner.hostname ?? '?'}${beat}: ${owner.alive ? 'alive' : `gone (no heartbeat for ${OWNER_ALIVE_SECONDS}s)`}`
}

/** What a force-expire of this key would do now. */
export function previewText(detail: KeyDetail): string {
  if (detail.expirePreview === 'not_processing') return `Nothing to expire: the key is ${detail.status}, not in processing.`
  if (detail.expirePreview === 'worker_alive') return 'A force-expire would be refused now: the key is within its deadline and its owner process is alive, so its worker is still processing it. It finishes or fails on its own, at the latest at its deadline.'
  return `A force-expire would release the key now (${detail.stale ? 'it is past its deadline' : 'its owner process is gone'}): the client's next retry runs the request again with the same downstream key, so a charge already made is returned, not repeated.`
}

/** A route's stored summary as `name value, name value`: plain text, for the page and the CLI to show by the one rule (characters.ts). */
export function summaryText(summary: Readonly<Record<string, unknown>>): string {
  return Object.entries(summary).map(([name, value]) => `${name} ${typeof value === 'string' ? value : JSON.stringify(value)}`).join(', ')
}
