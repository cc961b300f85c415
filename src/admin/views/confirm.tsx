/** The confirmation step of every destructive action: exactly what it will do, then one button. */
import { visibleText } from '../../characters'
import { escapeHtml } from '@kitajs/html'
import type { ExpireStalePreview, PurgePreview } from '../../operations/actions'
import { formatAge, formatTime } from '../../operations/format'
import type { KeyDetail } from '../../operations/show'
import { Layout, type Operator } from '../layout'
import { keyHref, listHref } from '../links'
import type { KeyFilters } from '../../operations/filters'
import { ownerText, previewText } from '../../operations/describe'

export interface ConfirmExpireProps {
  readonly operator: Operator
  readonly detail: KeyDetail
  /** The lease the operator saw; the action is conditional on it. */
  readonly lease: string
  readonly back: string | undefined
}

export function ConfirmExpirePage(props: ConfirmExpireProps): JSX.Element {
  const { detail, operator } = props
  const changed = detail.lease !== props.lease || detail.status !== 'processing'
  const detailHref = keyHref(detail.tenant, detail.key, { back: props.back })
  return (
    <Layout title="Force-expire this key? · admin" operator={operator}>
      <h2>Force-expire this key?</h2>
      <dl class="facts" id="confirm-facts">
        <dt>Tenant</dt><dd class="mono" safe>{visibleText(detail.tenant)}</dd>
        <dt>Key</dt><dd class="mono" safe>{visibleText(detail.key)}</dd>
        <dt>Request</dt><dd class="mono" safe>{visibleText(`${detail.method} ${detail.path}`)}</dd>
        <dt>Lease</dt><dd class="mono" safe>{props.lease}</dd>
        <dt>Attempts</dt><dd>{detail.attempts}</dd>
        <dt>Lease age</dt><dd safe>{`${formatAge(detail.ageSeconds)}${detail.deadline ? ` (deadline ${formatTime(detail.deadline)}${detail.stale ? ', passed' : ''})` : ''}`}</dd>
        <dt>Owner process</dt><dd safe>{ownerText(detail)}</dd>
        <dt>Downstream key</dt><dd class="mono" safe>{detail.downstreamKey}</dd>
      </dl>
      {changed ? (
        <>
          <div class="notice warn" safe>{`The key changed since you looked: it is now ${detail.status}${detail.status === 'processing' ? ` under lease ${detail.lease}` : ''}. Nothing will be done from this page; look at the key again.`}</div>
          <p><a class="button" href={escapeHtml(detailHref)}>Back to the key</a></p>
        </>
      ) : (
        <>
          <p id="what-happens" safe>{previewText(detail)}</p>
          <p class="muted">
            The action is conditional on lease <span class="mono" safe>{props.lease}</span>: if the key completes, is released or is taken over
            before you confirm, nothing is done. It is recorded in the audit trail under your name.
          </p>
          <form method="post" action="/admin/keys/expire" class="bar">
            <input type="hidden" name="csrf" value={escapeHtml(operator.csrf)} />
            <input type="hidden" name="tenant" value={escapeHtml(detail.tenant)} />
            <input type="hidden" name="key" value={escapeHtml(detail.key)} />
            <input type="hidden" name="lease" value={escapeHtml(props.lease)} />
            {props.back ? <input type="hidden" name="back" value={escapeHtml(props.back)} /> : ''}
            <button type="submit" class="danger">{detail.expirePreview === 'expire' ? 'Release the key' : 'Try anyway (it will be refused)'}</button>
            <a class="button" href={escapeHtml(detailHref)}>Cancel</a>
          </form>
        </>
      )}
    </Layout>
  )
}

export function ConfirmExpireStalePage(props: { operator: Operator; preview: ExpireStalePreview }): JSX.Element {
  const { preview, operator } = props
  const more = preview.stale - preview.keys.length
  return (
    <Layout title="Expire all stale? · admin" operator={operator}>
      <h2>Expire all stale keys?</h2>
      <p>
        {preview.stale} key(s) in processing {preview.tenant ? <>of tenant <span class="mono" safe>{visibleText(preview.tenant)}</span> </> : ''}
        were older than the TTL ({preview.ttlSeconds}s) at <span class="mono" safe>{formatTime(preview.asOf)}</span>:
      </p>
      {preview.keys.length > 0 ? (
        <ul id="stale-keys">
          {preview.keys.map((key) => <li><span class="mono" safe>{visibleText(`${key.tenant} ${key.key}`)}</span> <span class="muted" safe>{`(${visibleText(`${key.method} ${key.path}`)}, ${formatAge(key.ageSeconds)}, attempts ${key.attempts})`}</span></li>)}
          {more > 0 ? <li class="muted">and {more} more</li> : ''}
        </ul>
      ) : ''}
      <p>
        Each one is released, so its client's next retry runs the request again (with the same downstream key). Keys
        whose completion is committing at that instant are skipped and reported. Keys that completed or were taken
        over after this moment are left alone. One audit entry per key, and one for the whole action.
      </p>
      <form method="post" action="/admin/expire-stale" class="bar">
        <input type="hidden" name="csrf" value={escapeHtml(operator.csrf)} />
        <input type="hidden" name="as_of" value={escapeHtml(preview.asOf.toISOString())} />
        <input type="hidden" name="tenant" value={escapeHtml(preview.tenant ?? '')} />
        <button type="submit" class="danger">Expire {preview.stale} stale key(s)</button>
        <a class="button" href={escapeHtml(listHref({ tenant: preview.tenant, staleOnly: true } satisfies KeyFilters))}>Cancel</a>
      </form>
    </Layout>
  )
}

export function ConfirmPurgePage(props: { operator: Operator; preview: PurgePreview }): JSX.Element {
  const { preview, operator } = props
  return (
    <Layout title="Purge expired keys? · admin" operator={operator}>
      <h2>Purge keys past retention?</h2>
      <p>
        At <span class="mono" safe>{formatTime(preview.asOf)}</span>, {preview.done} completed key(s) and {preview.released} released
        key(s) were past retention ({preview.retentionSeconds}s).
      </p>
      <p>
        They are deleted. None of them is replayed any more: a retry with one of these keys already counts as a new
        request. While the background purge keeps up it deletes them within a minute; when it is behind
        (IdempotencyPurgeBehind), this deletes them now, from this process.
      </p>
      <form method="post" action="/admin/purge" class="bar">
        <input type="hidden" name="csrf" value={escapeHtml(operator.csrf)} />
        <button type="submit" class="danger">Delete {preview.done + preview.released} key(s)</button>
        <a class="button" href="/admin">Cancel</a>
      </form>
    </Layout>
  )
}
