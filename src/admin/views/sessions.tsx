/** Open admin sessions: who, from where, since when, last seen; each can be ended. */
import { visibleText } from '../../characters'
import { escapeHtml } from '@kitajs/html'
import { formatTime } from '../../operations/format'
import { SESSION_IDLE_SECONDS } from '../sessions'
import type { SessionSummary } from '../sessions'
import type { Revocation } from '../operators'
import { Layout, type Operator } from '../layout'

export interface SessionsPageProps {
  readonly operator: Operator
  /** Open sessions; `revoked` when this process no longer has the credential one was opened with. */
  readonly sessions: readonly (SessionSummary & { readonly revoked?: Revocation | undefined })[]
  /** This browser's session. */
  readonly current: string
  /** The session just ended, to say so. */
  readonly ended?: string | undefined
}

/** Why a listed session opens nothing any more: it ends at its next request. */
const REVOKED: Record<Revocation, string> = {
  'operator-removed': 'revoked: this operator is no longer in ADMIN_TOKENS (or ADMIN_TOKEN); it ends at its next request',
  'token-changed': 'revoked: this operator\'s token changed since it signed in; it ends at its next request',
}

export function SessionsPage({ operator, sessions, current, ended }: SessionsPageProps): JSX.Element {
  return (
    <Layout title="Sessions · admin" operator={operator}>
      <h2>Open sessions</h2>
      {ended ? <div class="notice ok" role="status" safe>{`Session #${ended} ended: its cookie opens nothing any more.`}</div> : ''}
      <p class="muted">A session ends when its operator signs out, when it is ended here, after {SESSION_IDLE_SECONDS / 60} minutes without a request, or once its operator is removed from the configuration or given another token.</p>
      <table class="cards sessions">
        <thead>
          <tr><th>#</th><th>Operator</th><th>Address</th><th>Started (UTC)</th><th>Last seen (UTC)</th><th></th></tr>
        </thead>
        <tbody>
          {sessions.map((session) => (
            <tr>
              <td data-label="Session" class="num" safe>{`#${session.id}`}</td>
              <td data-label="Operator">
                <span safe>{visibleText(session.operator)}</span>
                {session.note ? <span class="muted" safe>{` (${visibleText(session.note)})`}</span> : ''}
                {session.id === current ? <span class="tag fresh">this browser</span> : ''}
                {session.revoked ? <div class="muted" safe>{REVOKED[session.revoked]}</div> : ''}
              </td>
              <td data-label="Address" class="mono" safe>{visibleText(session.address)}</td>
              <td data-label="Started" class="mono" safe>{formatTime(session.startedAt)}</td>
              <td data-label="Last seen" class="mono" safe>{formatTime(session.lastSeenAt)}</td>
              <td data-label="" class="actions">
                <form class="inline" method="post" action="/admin/sessions/end">
                  <input type="hidden" name="csrf" value={escapeHtml(operator.csrf)} />
                  <input type="hidden" name="id" value={escapeHtml(session.id)} />
                  <button type="submit" class="danger">{session.id === current ? 'Sign out' : 'End session'}</button>
                </form>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </Layout>
  )
}
