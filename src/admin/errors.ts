/** Why an admin request is refused before its handler: thrown by guards and parsers, answered by routes.ts's onError. */

/** No valid Bearer token on /admin/api: 401 with a challenge. */
export class ApiUnauthorizedError extends Error {
  constructor() {
    super('Send Authorization: Bearer <operator token> (ADMIN_TOKENS or ADMIN_TOKEN).')
    this.name = 'ApiUnauthorizedError'
  }
}

/** Too many wrong tokens from this address (throttle.ts): 429 with Retry-After, the token not even looked at. */
export class ThrottledError extends Error {
  constructor(readonly retryAfterSeconds: number) {
    super(`Too many wrong admin tokens from this address; retry after ${retryAfterSeconds} s.`)
    this.name = 'ThrottledError'
  }
}

/** No valid session on a page: GET goes to the sign-in form, anything else gets 401. */
export class SignedOutError extends Error {
  constructor() {
    super('Your session has ended. Sign in again.')
    this.name = 'SignedOutError'
  }
}

/** A state-changing form from another site, or without this session's CSRF token: 403, nothing done. */
export class CrossSiteError extends Error {
  constructor() {
    super('This form did not come from this admin page (cross-site request or stale form). Nothing was done.')
    this.name = 'CrossSiteError'
  }
}

/** Something asked for does not exist (a key, an audit entry): 404. */
export class NotFoundError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'NotFoundError'
  }
}
