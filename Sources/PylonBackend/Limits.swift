/// Fixed limits of the reference backend. Each one, when exceeded, produces the error named
/// next to it (see docs/backend-openapi.yaml for the wire form).
enum Limits {
    /// Request line plus headers, enforced by http-parser (`http_parser_set_max_header_size`).
    /// Exceeded: 431 `header_too_large`, then the connection is closed.
    static let maxHeaderBytes = 64 * 1024
    /// Header fields per request. Exceeded: 431 `header_too_large`, then close.
    static let maxHeaderCount = 100
    /// Default for `--max-connections`: open client connections. At the limit a new connection
    /// makes room by closing the least recently active connection that is not answering a
    /// held request (see `Server.accept`); when every connection is, the new one gets 503
    /// `too_many_connections` and is closed.
    static let defaultMaxConnections = 1024
    /// Default for `--max-body`: request body bytes, both as received and after gunzip.
    /// Exceeded: 413 `payload_too_large` (then close when the body was not read).
    static let defaultMaxBody = 1 << 20
    /// Requests parsed but not yet answered on one connection (pipelining). At this depth the
    /// parser pauses after the request and the connection stops reading until the queue
    /// drains; nothing is refused.
    static let maxQueuedRequests = 64
    /// Body bytes of the requests parsed but not yet answered on one connection: like
    /// `maxQueuedRequests`, reaching it pauses parsing (so a queue of large pipelined bodies
    /// holds at most this plus one request).
    static let maxQueuedBodyBytes = 4 << 20
    /// Response bytes queued for a client that does not read (high-water mark). Above this the
    /// connection stops answering, parsing and reading; it resumes once the queued bytes are
    /// down to `pendingOutputLowWater`. One connection's output is therefore bounded by this
    /// plus one response, however much the client pipelines. (Unbounded, 4 connections that
    /// pipelined 64 KiB of `GET /v1/inspect/stats` each took the backend from 10 to 404 MB.)
    static let maxPendingOutput = 1 << 20
    /// Default for `--max-output-bytes`: response bytes queued for writing across all
    /// connections. A response larger than `smallResponseBytes` that would take the total
    /// over it, while other responses are queued, is answered 503 `server_busy` with
    /// `Retry-After: 1` instead (one response is always let through, so a page larger than the
    /// budget is not refused forever). Unbounded, 120 connections that asked for 8 MiB record
    /// pages and read nothing held 1,041 MB.
    static let defaultMaxOutputBytes = 64 << 20
    /// Responses up to this size are never refused by the output budget (errors, health,
    /// small pages): at most `--max-connections` of them are held.
    static let smallResponseBytes = 64 << 10
    static let pendingOutputLowWater = 256 << 10
    /// Default for `--idle-timeout-ms`: between requests, a connection with no complete
    /// request and no completed write for this long is closed (partial bytes do not count).
    static let defaultIdleTimeoutMs: UInt64 = 120_000
    /// Default for `--header-timeout-ms`: a request head (request line and headers) must be
    /// complete this long after its first byte. Exceeded: 408 `request_timeout`, then close.
    static let defaultHeaderTimeoutMs: UInt64 = 20_000
    /// Default for `--body-timeout-ms`: a request body must be complete this long after its
    /// head (1 MiB at a modest 20 KiB/s). Exceeded: 408 `request_timeout`, then close.
    static let defaultBodyTimeoutMs: UInt64 = 60_000
    /// After the last response of a closing connection, how long input is drained before the
    /// socket is closed (so a client still sending a rejected body sees the response).
    static let lingerMs: UInt64 = 2_000
    /// Stream names, idempotency keys and record ids, in UTF-8 bytes. Exceeded: 400.
    static let maxNameBytes = 256
    /// Largest page of `GET /v1/inspect/streams/{stream}/records` (and the default is 100).
    static let maxRecordsPage = 1000
    static let defaultRecordsPage = 100
    /// A page of records ends after the record that brings its ids and data to this many bytes
    /// (`next` goes on): 1000 records of 1 MiB made one 100 MB answer and a 430 MB peak.
    static let maxRecordsPageBytes = 8 << 20
    /// Distinct keys of `requestsByPath` in `/v1/inspect/stats`; later paths count under "(other)".
    static let maxDistinctPaths = 1024
    /// Largest injectable latency. Exceeded: 400.
    static let maxLatencyMs = 600_000
    /// JSON nesting depth accepted in request bodies. Exceeded: 400 `invalid_json`.
    static let maxJSONDepth: Int32 = 64
    /// MA `user_id`, `anonymous_id`, `email` and contact names, in characters. Exceeded:
    /// per-field 3003 (contact names: -3).
    static let maxIdentifierChars = 256
    /// MA `phone` in characters (`+` and 6 to 20 digits). Exceeded: per-field 3003.
    static let maxPhoneChars = 32
    /// MA `deviceId` and `project`, in characters. Exceeded: -3.
    static let maxMAKeyChars = 256
    /// MA user properties named in one call. Exceeded: 4007.
    static let maxPropertiesPerCall = 100
    /// MA property names, in UTF-8 bytes. Exceeded: 4006.
    static let maxPropertyNameBytes = 50
    /// Bytes read from a socket per `uv_read` callback.
    static let readBufferSize = 64 * 1024
    /// `listen(2)` backlog.
    static let listenBacklog: Int32 = 511
    /// How long an operator's approval of a re-enrolment (`POST /v1/admin/devices/{id}/reenrol`)
    /// lets the enrolment secret register that existing install again (once).
    static let reenrolmentApprovalMs: Int64 = 24 * 3_600_000
    /// (device, AppKey) pairs an instance remembers as declared before starting over (each
    /// forgotten pair costs one database read or write at its next use).
    static let maxRememberedDeviceApps = 100_000
}
