/// The pixel sender's schedule (GET streams, `"delivery": "get"`, such as GTM's `gtm.pixels`): which
/// queued pixel goes now, and what happens to one whose request came back. A pure value: the
/// shell (`Uploader+Get`) feeds it pixels cut from the queue, the outcomes of their requests and
/// the time; it never touches the disk, the network or a clock.
///
/// Pixels wait in **lanes**, one per stream, owner (the uid a pixel was made for, `data.owner`,
/// else the stream's owner) and destination (host and port). A lane sends one pixel at a time,
/// oldest first, and backs off on its own after a failure, so a failing destination holds only
/// its own lane: another owner's pixels, and the same owner's to other destinations, go on. At
/// most `maxInFlight` requests are in flight in all, and at most `maxInFlightPerHost` to one
/// destination, so a destination that hangs takes only its share. A pixel that fails
/// `maxAttempts` times (network errors, 5xx, 408, 429) is given up: dead-lettered, with its last
/// status and reason.
struct PixelScheduler {
    /// The named, configurable bounds (uploader config `pixels`, docs/UPLOADER.md).
    struct Limits: Equatable {
        /// Requests in flight at once over every GET stream (config `pixels.maxInFlight`).
        var maxInFlight = 8
        /// Requests in flight at once to one destination, host and port (`pixels.maxInFlightPerHost`).
        var maxInFlightPerHost = 2
        /// Tries of one pixel before it is dead-lettered (`pixels.maxAttempts`), counted since
        /// the uploader started.
        var maxAttempts = 8
        /// Pixels cut from the queue and waiting in lanes at once (`pixels.maxScheduled`): the
        /// bound of this machine's memory. Beyond it the rest stays queued on disk, in order,
        /// until lanes drain.
        var maxScheduled = 16_384

        static let maxInFlightRange: ClosedRange<Int64> = 1...256
        static let maxAttemptsRange: ClosedRange<Int64> = 1...1_000
        static let maxScheduledRange: ClosedRange<Int64> = 1...1_000_000
    }

    /// Who a pixel is for and where it goes.
    struct Lane: Hashable {
        var stream: String
        /// `uid:N`, `plugin:NAME` (at most `maxOwnerBytes`).
        var owner: String
        /// `host:port`, lower-case, the port explicit (the scheme's default when the URL has none).
        var destination: String
    }

    /// The longest owner label kept (a longer `data.owner` is cut).
    static let maxOwnerBytes = 64

    /// What to do with a pixel whose request came back.
    enum Decision: Equatable {
        /// Delivered: delete it.
        case delivered
        /// Keep it at the head of its lane; the lane waits `delayMs` (and the destination, after a
        /// `Retry-After`, until `destinationHeldUntilMs`).
        case retry(reason: String, delayMs: UInt64, attempts: Int)
        /// Set it aside as a dead letter (a permanent refusal, or `maxAttempts` reached).
        case deadLetter(status: Int, reason: String)
    }

    private struct Pixel {
        var lane: Lane
        var attempts = 0
        var inFlight = false
    }

    private struct LaneState {
        /// Keys, oldest first, from `head` on.
        var keys: [String] = []
        var head = 0
        var inFlight = false
        var notBeforeMs: UInt64 = 0
        /// Consecutive failures (the backoff's exponent); 0 after a delivery.
        var failures = 0
        var isEmpty: Bool { head >= keys.count }
        mutating func popHead() {
            head += 1
            if head >= 64 && head * 2 >= keys.count {
                keys.removeFirst(head)
                head = 0
            }
        }
    }

    var limits: Limits
    private var pixels: [String: Pixel] = [:]
    private var lanes: [Lane: LaneState] = [:]
    /// Lanes in the order they are offered a send; rotated so none is always first.
    private var order: [Lane] = []
    private var cursor = 0
    private var perDestination: [String: Int] = [:]
    private(set) var inFlight = 0
    /// A destination's `Retry-After`: nothing goes there before this time.
    private var destinationHeld: [String: UInt64] = [:]

    init(limits: Limits = Limits()) { self.limits = limits }

    /// Pixels waiting or in flight.
    var scheduled: Int { pixels.count }
    /// Whether another pixel may be cut from the queue and added.
    var hasRoom: Bool { pixels.count < limits.maxScheduled }
    var laneCount: Int { lanes.count }
    func contains(_ key: String) -> Bool { pixels[key] != nil }
    func isInFlight(_ key: String) -> Bool { pixels[key]?.inFlight == true }
    /// `stream`'s pixels waiting or in flight, those in flight, its lanes and those waiting after
    /// a failure (`uploader.status`).
    func summary(stream: String, now: UInt64) -> (scheduled: Int, inFlight: Int, lanes: Int, waitingLanes: Int) {
        var out = (scheduled: 0, inFlight: 0, lanes: 0, waitingLanes: 0)
        for (lane, st) in lanes where lane.stream == stream {
            out.scheduled += st.keys.count - st.head
            out.inFlight += st.inFlight ? 1 : 0
            out.lanes += 1
            out.waitingLanes += st.notBeforeMs > now ? 1 : 0
        }
        return out
    }

    /// A pixel cut from the queue joins the tail of its lane. False (nothing changes) when it is
    /// already scheduled or there is no room.
    @discardableResult
    mutating func add(_ key: String, lane: Lane) -> Bool {
        guard pixels[key] == nil, hasRoom else { return false }
        pixels[key] = Pixel(lane: lane)
        if lanes[lane] == nil {
            lanes[lane] = LaneState()
            order.append(lane)
        }
        lanes[lane]!.keys.append(key)
        return true
    }

    /// The pixels to request now, marked in flight: the head of every lane whose wait is over,
    /// one per lane, within the in-flight bounds, lanes taken in turn.
    mutating func next(now: UInt64) -> [(key: String, stream: String)] {
        var out: [(key: String, stream: String)] = []
        guard inFlight < limits.maxInFlight, !order.isEmpty else { return out }
        let n = order.count
        let start = cursor % n
        var visited = 0
        while visited < n, inFlight < limits.maxInFlight {
            let lane = order[(start + visited) % n]
            visited += 1
            guard var st = lanes[lane], !st.inFlight, !st.isEmpty, st.notBeforeMs <= now else { continue }
            if let held = destinationHeld[lane.destination], held > now { continue }
            guard perDestination[lane.destination, default: 0] < limits.maxInFlightPerHost else { continue }
            let key = st.keys[st.head]
            st.inFlight = true
            lanes[lane] = st
            pixels[key]?.inFlight = true
            perDestination[lane.destination, default: 0] += 1
            inFlight += 1
            out.append((key, lane.stream))
        }
        // The next call starts after the last lane looked at.
        cursor = (start + visited) % n
        return out
    }

    /// The request of `key` came back: `status` (nil: no HTTP answer) and its classification
    /// (`UploadOutcome.classifyGet`). Frees its in-flight slots and answers what to do with it.
    /// A pixel not in flight (removed meanwhile) is answered as given and changes nothing.
    mutating func finished(
        _ key: String, status: Int?, _ outcome: UploadOutcome, now: UInt64, retry: RetryPolicy, random: Double
    ) -> Decision {
        guard var px = pixels[key], px.inFlight else { return PixelScheduler.plain(outcome, status: status) }
        px.inFlight = false
        let lane = px.lane
        endFlight(lane)
        px.attempts += 1
        switch outcome {
        case .delivered:
            lanes[lane]?.failures = 0
            removeHead(key, lane)
            return .delivered
        case .rejected(let s, let reason):
            removeHead(key, lane)
            return .deadLetter(status: s, reason: reason)
        case .tooLarge:
            removeHead(key, lane)
            return .deadLetter(status: 413, reason: "too large for the destination")
        case .retry(let reason, let retryAfter):
            guard px.attempts < limits.maxAttempts else {
                removeHead(key, lane)
                lanes[lane]?.failures = 0
                return .deadLetter(status: status ?? 0, reason: "gave up after \(px.attempts) attempts (pixels.maxAttempts): \(reason)")
            }
            pixels[key] = px
            let failures = (lanes[lane]?.failures ?? 0) + 1
            let delay = StreamState.retryDelay(attempts: failures, policy: retry, retryAfterMs: retryAfter, random: random)
            lanes[lane]?.failures = failures
            lanes[lane]?.notBeforeMs = now + delay
            if let ra = retryAfter { destinationHeld[lane.destination] = now + retry.honoured(ra) }
            return .retry(reason: reason, delayMs: delay, attempts: px.attempts)
        }
    }

    /// `key` could not be requested for a local reason (the queue could not be read): its flight
    /// ends without counting an attempt and its lane waits `delayMs`.
    mutating func localFailure(_ key: String, now: UInt64, delayMs: UInt64) {
        guard var px = pixels[key], px.inFlight else { return }
        px.inFlight = false
        pixels[key] = px
        endFlight(px.lane)
        lanes[px.lane]?.notBeforeMs = now + delayMs
    }

    /// `key` leaves the schedule without a request (purged: its consent switch was denied). A
    /// pixel in flight is not removed (its answer comes back through `finished`).
    @discardableResult
    mutating func remove(_ key: String) -> Bool {
        guard let px = pixels[key], !px.inFlight else { return false }
        pixels[key] = nil
        if var st = lanes[px.lane] {
            st.keys.removeAll { $0 == key }
            st.head = min(st.head, st.keys.count)
            lanes[px.lane] = st
            dropIfIdle(px.lane)
        }
        return true
    }

    /// A flush of `stream`: its lanes skip their wait (a destination's `Retry-After` still holds).
    mutating func flush(stream: String) {
        for (lane, _) in lanes where lane.stream == stream { lanes[lane]?.notBeforeMs = 0 }
    }

    /// The earliest time `next` can answer a pixel with nothing else happening (a wait ending),
    /// or nil when only an event can (a request coming back, a pixel added).
    func nextWake(now: UInt64) -> UInt64? {
        guard inFlight < limits.maxInFlight else { return nil }
        var earliest: UInt64?
        for (lane, st) in lanes where !st.inFlight && !st.isEmpty {
            guard perDestination[lane.destination, default: 0] < limits.maxInFlightPerHost else { continue }
            let w = max(st.notBeforeMs, destinationHeld[lane.destination] ?? 0, now)
            earliest = min(earliest ?? w, w)
        }
        return earliest
    }

    // MARK: Internals

    /// The outcome of a request for a pixel no longer scheduled, as a decision.
    private static func plain(_ outcome: UploadOutcome, status: Int?) -> Decision {
        switch outcome {
        case .delivered: return .delivered
        case .rejected(let s, let r): return .deadLetter(status: s, reason: r)
        case .tooLarge: return .deadLetter(status: 413, reason: "too large for the destination")
        case .retry(let r, _): return .retry(reason: r, delayMs: 0, attempts: 0)
        }
    }

    private mutating func endFlight(_ lane: Lane) {
        lanes[lane]?.inFlight = false
        inFlight = max(0, inFlight - 1)
        let left = perDestination[lane.destination, default: 1] - 1
        perDestination[lane.destination] = left > 0 ? left : nil
    }

    private mutating func removeHead(_ key: String, _ lane: Lane) {
        pixels[key] = nil
        guard var st = lanes[lane] else { return }
        if !st.isEmpty, st.keys[st.head] == key {
            st.popHead()
        } else {
            st.keys.removeAll { $0 == key }
            st.head = min(st.head, st.keys.count)
        }
        lanes[lane] = st
        dropIfIdle(lane)
    }

    /// A lane with nothing waiting and nothing in flight is forgotten (its backoff with it: the
    /// next pixel to that destination tries at once).
    private mutating func dropIfIdle(_ lane: Lane) {
        guard let st = lanes[lane], st.isEmpty, !st.inFlight else { return }
        lanes[lane] = nil
        if let i = order.firstIndex(of: lane) {
            order.remove(at: i)
            if cursor > i { cursor -= 1 }
        }
        if destinationHeld[lane.destination] != nil, !lanes.keys.contains(where: { $0.destination == lane.destination }) {
            destinationHeld[lane.destination] = nil
        }
    }
}
