/// The input side of a `Connection` as an explicit state: where the connection is in its life
/// (`Phase`), and the gate that decides whether its input may be dispatched — the owner wants
/// input, it is not backpressured (its own output is not being taken), and no other connection it
/// feeds holds it (`holds`). `sync` says what makes libuv's reading and the backlog's scheduling
/// match the state.
///
/// No I/O: `Connection` performs the returned `Effects` (`uv_read_start`/`uv_read_stop`, one
/// `nextTurn` for the backlog). Unit-tested in ConnectionGateTests.
public struct ConnectionGate: Equatable, Sendable {
    public enum Phase: Equatable, Sendable {
        /// Reading and writing.
        case open
        /// The peer shut down its sending side (EOF with an `onEOF` owner): no more input, replies
        /// still go out; the owner decides when to close.
        case halfClosed
        /// `closeAfterFlush`: no more input; closes once everything queued is written.
        /// `peerShutdown`: it had been half-closed first.
        case closingAfterFlush(peerShutdown: Bool)
        /// Closed (`peerShutdown`: after the peer's shutdown, which stays reported).
        case closed(peerShutdown: Bool)
    }

    public private(set) var phase: Phase = .open
    /// The owner wants input (`startReading`).
    public private(set) var wantsReading = false
    /// libuv is reading (`uv_read_start` in effect).
    public private(set) var uvReading = false
    /// Reading is paused because more than `pauseAbove` waits to be written to the peer.
    public private(set) var backpressured = false
    /// Holds placed by `hold(until:)` (connections this one feeds that are congested).
    public private(set) var holds = 0
    /// A dispatch of the backlog is scheduled for the next loop turn.
    public private(set) var backlogScheduled = false

    public init() {}

    /// What the shell does to match the state, in this order.
    public struct Effects: Equatable, Sendable {
        public var startRead = false
        public var stopRead = false
        public var scheduleBacklog = false
        public init(startRead: Bool = false, stopRead: Bool = false, scheduleBacklog: Bool = false) {
            self.startRead = startRead
            self.stopRead = stopRead
            self.scheduleBacklog = scheduleBacklog
        }
    }

    public var isClosed: Bool { if case .closed = phase { return true }; return false }
    public var closeWhenFlushed: Bool { if case .closingAfterFlush = phase { return true }; return false }
    public var peerShutdown: Bool {
        switch phase {
        case .halfClosed: return true
        case .closingAfterFlush(let shut), .closed(let shut): return shut
        case .open: return false
        }
    }
    public var isHeld: Bool { holds > 0 }
    /// Input may be dispatched, if wanted.
    public var gateOpen: Bool { !isClosed && holds == 0 && !backpressured }
    public var canDispatch: Bool { wantsReading && gateOpen }

    /// Makes reading match the gate: libuv reads only while input is wanted, the gate is open and
    /// no backlog waits (the backlog goes first); a backlog is scheduled once while it may go on.
    public mutating func sync(hasBacklog: Bool) -> Effects {
        var e = Effects()
        let active = wantsReading && gateOpen && !hasBacklog
        if active && !uvReading {
            uvReading = true
            e.startRead = true
        } else if !active && uvReading && !isClosed {
            uvReading = false
            e.stopRead = true
        }
        if canDispatch && hasBacklog && !backlogScheduled {
            backlogScheduled = true
            e.scheduleBacklog = true
        }
        return e
    }

    // MARK: Events (each followed by `sync` where reading may change)

    /// The owner asks for input; ignored once closed or after the peer's shutdown. Returns whether
    /// it took.
    public mutating func startReading() -> Bool {
        guard !isClosed, !peerShutdown else { return false }
        wantsReading = true
        return true
    }

    public mutating func stopReading() { wantsReading = false }

    /// End of input with an owner that keeps the connection (`onEOF`).
    public mutating func peerShutDown() {
        wantsReading = false
        switch phase {
        case .open: phase = .halfClosed
        case .closingAfterFlush: phase = .closingAfterFlush(peerShutdown: true)
        case .halfClosed, .closed: break
        }
    }

    public mutating func closeAfterFlush() {
        wantsReading = false
        switch phase {
        case .open: phase = .closingAfterFlush(peerShutdown: false)
        case .halfClosed: phase = .closingAfterFlush(peerShutdown: true)
        case .closingAfterFlush, .closed: break
        }
    }

    /// Output went over `pauseAbove` (true) or drained to half of it (false).
    public mutating func setBackpressured(_ on: Bool) { backpressured = on }

    public mutating func hold() { holds += 1 }
    public mutating func release() { holds -= 1 }

    /// The scheduled backlog dispatch runs now.
    public mutating func backlogRan() { backlogScheduled = false }

    /// Closes; returns true if libuv's reading must be stopped (false too when already closed).
    public mutating func close() -> Bool {
        guard !isClosed else { return false }
        phase = .closed(peerShutdown: peerShutdown)
        let stop = uvReading
        uvReading = false
        return stop
    }
}
