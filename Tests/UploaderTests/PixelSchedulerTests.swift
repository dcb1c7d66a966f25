import Testing

@testable import pylon_uploader

/// Issue 32 item 4: the pixel sender's lanes (`PixelScheduler`, a value on a fake clock) and the
/// `allowedHosts` port rule (`EndpointRule`).
@Suite struct PixelSchedulerTests {
    let retry = RetryPolicy(initialMs: 1_000, maxMs: 60_000, jitter: 0)

    func lane(_ owner: String, _ dest: String, stream: String = "gtm.pixels") -> PixelScheduler.Lane {
        PixelScheduler.Lane(stream: stream, owner: owner, destination: dest)
    }

    func keys(_ s: inout PixelScheduler, _ now: UInt64) -> [String] { s.next(now: now).map(\.key) }

    /// The attack of the issue: uid 65534's pixels to a destination that answers 401/5xx
    /// forever. uid 1000's pixel to a healthy destination goes at once, while the failing lane
    /// backs off on its own.
    @Test func aFailingDestinationHoldsOnlyItsOwnLane() {
        var s = PixelScheduler()
        s.add("bad1", lane: lane("uid:65534", "127.0.0.1:8850"))
        s.add("bad2", lane: lane("uid:65534", "127.0.0.1:8850"))
        #expect(keys(&s, 0) == ["bad1"], "one request per lane")
        let d = s.finished("bad1", status: 503, .retry(reason: "HTTP 503", retryAfterMs: nil), now: 10, retry: retry, random: 0)
        #expect(d == .retry(reason: "HTTP 503", delayMs: 1_000, attempts: 1))
        s.add("good", lane: lane("uid:1000", "127.0.0.1:80"))
        #expect(keys(&s, 20) == ["good"], "the failing lane waits; the other owner's pixel goes now")
        #expect(s.finished("good", status: 204, .delivered, now: 30, retry: retry, random: 0) == .delivered)
        #expect(s.nextWake(now: 30) == 1_010, "the failing lane's wait")
        #expect(keys(&s, 1_010) == ["bad1"], "the same pixel again, in order")
    }

    /// The same owner's pixels to another destination are not held either.
    @Test func aFailingDestinationDoesNotHoldTheSameOwnersOtherDestinations() {
        var s = PixelScheduler()
        s.add("a", lane: lane("uid:1000", "down.example:80"))
        s.add("b", lane: lane("uid:1000", "up.example:80"))
        #expect(Set(keys(&s, 0)) == ["a", "b"])
        _ = s.finished("a", status: nil, .retry(reason: "timeout", retryAfterMs: nil), now: 5, retry: retry, random: 0)
        s.add("c", lane: lane("uid:1000", "up.example:80"))
        _ = s.finished("b", status: 200, .delivered, now: 6, retry: retry, random: 0)
        #expect(keys(&s, 7) == ["c"])
    }

    /// A pixel that keeps failing is given up after `maxAttempts` tries: dead-lettered with its
    /// last status; the lane's next pixel goes.
    @Test func aPixelIsDeadLetteredAfterMaxAttempts() {
        var s = PixelScheduler(limits: .init(maxAttempts: 3))
        s.add("p", lane: lane("uid:1", "h:80"))
        s.add("q", lane: lane("uid:1", "h:80"))
        var t: UInt64 = 0
        var last: PixelScheduler.Decision?
        for _ in 0..<3 {
            #expect(keys(&s, t) == ["p"])
            last = s.finished("p", status: 500, .retry(reason: "HTTP 500", retryAfterMs: nil), now: t, retry: retry, random: 0)
            t += 100_000
        }
        #expect(last == .deadLetter(status: 500, reason: "gave up after 3 attempts (pixels.maxAttempts): HTTP 500"))
        #expect(!s.contains("p") && keys(&s, t) == ["q"], "given up; the next one goes without the old backoff")
    }

    /// A refusal (any 4xx but 408/429; 401 and 403 too for a pixel) is dead-lettered at once.
    @Test func permanentRefusalsAreDeadLetteredAtOnce() {
        #expect(
            UploadOutcome.classifyGet(status: 401, retryAfterMs: nil, error: nil)
                == .rejected(status: 401, reason: "HTTP 401 (a pixel carries no credentials)"))
        #expect(
            UploadOutcome.classifyGet(status: 403, retryAfterMs: nil, error: nil)
                != .retry(reason: "HTTP 403 (credentials refused)", retryAfterMs: nil))
        #expect(UploadOutcome.classifyGet(status: 302, retryAfterMs: nil, error: nil) == .delivered)
        if case .retry = UploadOutcome.classifyGet(status: 429, retryAfterMs: nil, error: nil) {} else { Issue.record("429 is retried") }
        var s = PixelScheduler()
        s.add("p", lane: lane("uid:1", "h:80"))
        _ = keys(&s, 0)
        let d = s.finished("p", status: 401, .rejected(status: 401, reason: "HTTP 401"), now: 1, retry: retry, random: 0)
        #expect(d == .deadLetter(status: 401, reason: "HTTP 401") && s.scheduled == 0 && s.laneCount == 0)
    }

    /// Bounded in flight: in all, and per destination (a destination that hangs takes only its
    /// share); lanes are served in turn.
    @Test func inFlightIsBoundedInTotalAndPerDestination() {
        var s = PixelScheduler(limits: .init(maxInFlight: 3, maxInFlightPerHost: 2))
        for o in 0..<4 { s.add("h\(o)", lane: lane("uid:\(o)", "hang.example:80")) }
        s.add("x", lane: lane("uid:9", "fast.example:80"))
        let first = keys(&s, 0)
        #expect(first.count == 3 && first.filter { $0.hasPrefix("h") }.count == 2 && first.contains("x"), "\(first)")
        #expect(s.inFlight == 3 && keys(&s, 1).isEmpty)
        _ = s.finished("x", status: 200, .delivered, now: 2, retry: retry, random: 0)
        #expect(keys(&s, 3).isEmpty, "the hanging destination's share is full")
        #expect(s.nextWake(now: 3) == nil, "nothing but an answer can free a slot")
    }

    /// A `Retry-After` holds the destination; a flush skips a lane's wait; `remove` purges.
    @Test func retryAfterFlushAndRemove() {
        var s = PixelScheduler()
        s.add("a", lane: lane("uid:1", "h:80"))
        s.add("b", lane: lane("uid:2", "h:80"))
        #expect(Set(keys(&s, 0)) == ["a", "b"])
        _ = s.finished("a", status: 429, .retry(reason: "HTTP 429", retryAfterMs: 30_000), now: 0, retry: retry, random: 0)
        _ = s.finished("b", status: 200, .delivered, now: 0, retry: retry, random: 0)
        s.add("c", lane: lane("uid:2", "h:80"))
        #expect(keys(&s, 1_000).isEmpty, "the destination asked for 30 s")
        #expect(s.nextWake(now: 1_000) == 30_000)
        s.flush(stream: "gtm.pixels")
        #expect(keys(&s, 1_000).isEmpty, "a flush does not override the destination's Retry-After")
        #expect(Set(keys(&s, 30_000)) == ["a", "c"])
        _ = s.finished("a", status: 503, .retry(reason: "HTTP 503", retryAfterMs: nil), now: 30_001, retry: retry, random: 0)
        s.flush(stream: "gtm.pixels")
        #expect(keys(&s, 30_002) == ["a"], "the flush skipped the lane's own wait")
        s.add("d", lane: lane("uid:3", "k:80"))
        let removedWaiting = s.remove("d")
        let removedInFlight = s.remove("a")
        #expect(removedWaiting && !removedInFlight, "a pixel in flight is not removed")
        #expect(!s.contains("d"))
    }

    /// At most `maxScheduled` pixels wait in lanes; the rest stays queued on disk.
    @Test func scheduledPixelsAreBounded() {
        var s = PixelScheduler(limits: .init(maxScheduled: 2))
        let a = s.add("a", lane: lane("uid:1", "h:80"))
        let b = s.add("b", lane: lane("uid:1", "h:80"))
        let c = s.add("c", lane: lane("uid:1", "h:80"))
        let again = s.add("a", lane: lane("uid:2", "h:80"))
        #expect(a && b && !c && !s.hasRoom && s.scheduled == 2)
        #expect(!again, "never twice")
    }

    // MARK: allowedHosts with ports

    /// A bare host allows the scheme's default port only; `host:port` that port; `host:*` any.
    @Test func allowedHostsNamePorts() throws {
        let local = try EndpointRule.allowedHosts(["127.0.0.1"], "allowedHosts")
        #expect(try EndpointRule.parse("http://127.0.0.1/px", allowedHosts: local).get().destination == "127.0.0.1:80")
        #expect(throws: UploaderConfigError.self) {
            try EndpointRule.parse("http://127.0.0.1:8850/v1/inspect/stats", allowedHosts: local).get()
        }
        #expect(throws: UploaderConfigError.self) { try EndpointRule.parse("https://127.0.0.1/px", allowedHosts: ["127.0.0.1:80"]).get() }
        let port = try EndpointRule.allowedHosts(["127.0.0.1:8081", "Pixel.Example:*", "[::1]:9000", "[fe80::1]"], "allowedHosts")
        #expect(port == ["127.0.0.1:8081", "pixel.example:*", "[::1]:9000", "fe80::1"])
        #expect(try EndpointRule.parse("http://127.0.0.1:8081/px", allowedHosts: port).get().destination == "127.0.0.1:8081")
        #expect(throws: UploaderConfigError.self) { try EndpointRule.parse("http://127.0.0.1:8850/px", allowedHosts: port).get() }
        #expect(try EndpointRule.parse("https://pixel.example:8443/p", allowedHosts: port).get().destination == "pixel.example:8443")
        #expect(try EndpointRule.parse("http://[::1]:9000/p", allowedHosts: port).get().destination == "[::1]:9000")
        #expect(try EndpointRule.parse("http://[fe80::1]/p", allowedHosts: port).get().destination == "[fe80::1]:80")
        for bad in ["http://127.0.0.1:0/p", "http://127.0.0.1:99999/p", "http://127.0.0.1:8o/p", "http://[::1]x/p"] {
            #expect(throws: UploaderConfigError.self, "\(bad)") { try EndpointRule.parse(bad, allowedHosts: nil).get() }
        }
        for bad in ["", "h:0", "h:70000", "h:x", ":80", "[]", "[::1]:", "a/b", "u@h"] {
            #expect(EndpointRule.allowedHost(bad) == nil, "\(bad)")
        }
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["streams": ["p": ["delivery": "get", "allowedHosts": ["h:x"]]]]) }
        #expect(throws: UploaderConfigError.self) {
            try UploaderConfig(["allowedHosts": ["127.0.0.1"], "endpoint": "http://127.0.0.1:8780/v1/batches/{stream}"])
        }
        _ = try UploaderConfig(["allowedHosts": ["127.0.0.1:8780"], "endpoint": "http://127.0.0.1:8780/v1/batches/{stream}"])
    }

    /// The `pixels` bounds are read strictly.
    @Test func pixelLimitsAreConfigurable() throws {
        let c = try UploaderConfig(["pixels": ["maxInFlight": 4, "maxInFlightPerHost": 1, "maxAttempts": 5, "maxScheduled": 100]])
        #expect(c.pixels == .init(maxInFlight: 4, maxInFlightPerHost: 1, maxAttempts: 5, maxScheduled: 100))
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["pixels": ["maxInFlight": 1, "maxInFlightPerHost": 2]]) }
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["pixels": ["maxAttempts": 0]]) }
        #expect(throws: UploaderConfigError.self) { try UploaderConfig(["pixels": 3]) }
    }
}
