/// Response bytes queued for writing across every connection, against `limit`
/// (`--max-output-bytes`; see `Limits.defaultMaxOutputBytes`). Loop thread only.
package final class OutputBudget {
    package var limit: Int
    /// Bytes queued now (each connection adds and removes its own share).
    package internal(set) var used = 0
    /// Responses answered 503 `server_busy` instead.
    package internal(set) var refused = 0

    package init(limit: Int) { self.limit = limit }
}
