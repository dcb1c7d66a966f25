import PylonCore

/// When an `MQTTClient` tries the broker again, as a value (no I/O; the caller passes the
/// time): each failed or lost connection waits the next `Backoff` delay, `initialMs` doubling
/// up to the ceiling `maxMs` (±jitter, never above it) while the broker stays away; the
/// sequence starts over from `initialMs` once a connection has lasted `stableMs` (the client's
/// keepalive). A connection dropped sooner (a broker that accepts and drops at once, a client
/// id used twice) does not reset it, so such a broker is not hammered.
public struct ReconnectBackoff: Sendable {
    public private(set) var backoff: Backoff
    /// How long a connection must last for the backoff to start over.
    public let stableMs: UInt64
    /// When the current connection was accepted (its CONNACK), while connected.
    public private(set) var connectedAtMs: UInt64?

    public init(initialMs: UInt64, maxMs: UInt64, jitter: Double, stableMs: UInt64, seed: UInt64 = 0x9E37) {
        backoff = Backoff(initialMs: initialMs, maxMs: maxMs, jitter: jitter, seed: seed)
        self.stableMs = stableMs
    }

    /// The broker accepted a connection at `nowMs`.
    public mutating func connected(nowMs: UInt64) { connectedAtMs = nowMs }

    /// The connection (if any) is gone at `nowMs`: the backoff starts over if it lasted.
    public mutating func lost(nowMs: UInt64) {
        if let at = connectedAtMs, nowMs >= at + stableMs { backoff.reset() }
        connectedAtMs = nil
    }

    /// The wait (ms) before the next attempt, counting it.
    public mutating func nextDelayMs() -> UInt64 { backoff.next() }

    /// Attempts since the last reset.
    public var attempt: Int { backoff.attempt }
}
