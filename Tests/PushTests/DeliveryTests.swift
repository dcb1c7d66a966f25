import PylonMQTT
import PylonPluginKit
import Testing

@testable import pylon_push

/// The delivery machine with a fake clock: no processes, no sleeps.
struct DeliveryTests {
    var limits: Delivery.Limits {
        var l = Delivery.Limits()
        l.maxCount = 3
        l.maxBytes = 1000
        l.maxInFlightPerApp = 2
        l.ackTimeoutMs = 100
        l.retryInitialMs = 10
        l.retryMaxMs = 40
        return l
    }

    @Test func aMessageForAnAttachedAppIsDeliveredWarmAndAckedOnce() {
        var d = Delivery(limits: limits)
        #expect(d.attach(appId: "a", client: 7, now: 0).isEmpty)
        let out = d.received(id: "m1", appId: "a", seq: 1, bytes: 10, expiresAt: 1000, now: 0)
        #expect(out == [.deliver(id: "m1", appId: "a", client: 7, coldStart: false, attempt: 1)])
        #expect(d.callbackResult(id: "m1", ok: true, now: 1) == [.acked(id: "m1", appId: "a")])
        #expect(d.callbackResult(id: "m1", ok: true, now: 2).isEmpty, "an ack is final")
        #expect(d.count == 0)
    }

    @Test func messagesWaitForTheirAppAndArriveCold() {
        var d = Delivery(limits: limits)
        #expect(d.received(id: "m1", appId: "a", seq: 1, bytes: 10, expiresAt: 1000, now: 0).isEmpty)
        #expect(d.attach(appId: "a", client: 1, now: 5) == [.deliver(id: "m1", appId: "a", client: 1, coldStart: true, attempt: 1)])
    }

    @Test func failuresAreRetriedWithBackoffAndTimeoutsCount() {
        var d = Delivery(limits: limits)
        _ = d.attach(appId: "a", client: 1, now: 0)
        _ = d.received(id: "m1", appId: "a", seq: 1, bytes: 10, expiresAt: 10_000, now: 0)
        #expect(d.callbackResult(id: "m1", ok: false, now: 10).isEmpty, "not before the backoff")
        #expect(d.nextDeadline() == 20)
        #expect(d.tick(now: 20) == [.deliver(id: "m1", appId: "a", client: 1, coldStart: false, attempt: 2)])
        // No reply: the ack timeout fails it, then the doubled backoff applies.
        #expect(d.tick(now: 120).isEmpty)
        #expect(d.tick(now: 140) == [.deliver(id: "m1", appId: "a", client: 1, coldStart: false, attempt: 3)])
        #expect(d.counters.failed == 2)
        #expect(d.counters.redelivered == 2)
        // A late success still acknowledges.
        #expect(d.callbackResult(id: "m1", ok: true, now: 150) == [.acked(id: "m1", appId: "a")])
    }

    @Test func restoredMessagesAreDeliveredAgainAfterARestart() {
        var d = Delivery(limits: limits)
        d.restore(
            Delivery.Entry(id: "m1", appId: "a", seq: 1, bytes: 5, expiresAt: 1000, attempts: 1, cold: false, inFlightUntil: 50), now: 0)
        #expect(d.attach(appId: "a", client: 3, now: 0).isEmpty, "redelivered with backoff")
        #expect(d.nextDeadline() == 10)
        #expect(d.tick(now: 10) == [.deliver(id: "m1", appId: "a", client: 3, coldStart: false, attempt: 2)])
    }

    @Test func expiredMessagesAreDiscarded() {
        var d = Delivery(limits: limits)
        #expect(d.received(id: "old", appId: "a", seq: 1, bytes: 5, expiresAt: 10, now: 10) == [.discard(id: "old", reason: .expired)])
        _ = d.received(id: "m", appId: "a", seq: 2, bytes: 5, expiresAt: 50, now: 0)
        #expect(d.nextDeadline() == 50)
        #expect(d.tick(now: 50) == [.discard(id: "m", reason: .expired)])
        #expect(d.counters.expired == 2)
        #expect(d.attach(appId: "a", client: 1, now: 60).isEmpty)
    }

    @Test func theInboxDropsTheOldestFirstByCountAndBytes() {
        var d = Delivery(limits: limits)
        for i in 1...3 { _ = d.received(id: "m\(i)", appId: "a", seq: Int64(i), bytes: 10, expiresAt: 1000, now: 0) }
        #expect(d.received(id: "m4", appId: "a", seq: 4, bytes: 10, expiresAt: 1000, now: 0) == [.discard(id: "m1", reason: .dropped)])
        #expect(
            d.received(id: "big", appId: "b", seq: 5, bytes: 990, expiresAt: 1000, now: 0)
                == [.discard(id: "m2", reason: .dropped), .discard(id: "m3", reason: .dropped)])
        #expect(d.counters.dropped == 3)
        #expect(d.count == 2)
        #expect(d.bytes == 1000)
    }

    @Test func inFlightIsBoundedPerApp() {
        var d = Delivery(limits: limits)
        _ = d.attach(appId: "a", client: 1, now: 0)
        var delivered = 0
        for i in 1...3 {
            delivered += d.received(id: "m\(i)", appId: "a", seq: Int64(i), bytes: 1, expiresAt: 1000, now: 0).count
        }
        #expect(delivered == 2)
        #expect(
            d.callbackResult(id: "m1", ok: true, now: 1) == [
                .acked(id: "m1", appId: "a"),
                .deliver(id: "m3", appId: "a", client: 1, coldStart: false, attempt: 1),
            ])
    }

    @Test func detachingLeavesMessagesUnacknowledged() {
        var d = Delivery(limits: limits)
        _ = d.attach(appId: "a", client: 1, now: 0)
        _ = d.received(id: "m1", appId: "a", seq: 1, bytes: 1, expiresAt: 1000, now: 0)
        #expect(d.clientClosed(1) == ["a"])
        #expect(d.attach(appId: "a", client: 2, now: 1) == [.deliver(id: "m1", appId: "a", client: 2, coldStart: false, attempt: 2)])
    }
}

struct RegistrationTests {
    @Test func registersAtStartUnlessDeferred() {
        var r = Registration(token: nil, deferred: false)
        #expect(r.start() == [.register])
        var deferred = Registration(token: nil, deferred: true)
        #expect(deferred.start().isEmpty)
        #expect(deferred.requestRegistration() == [.register])
    }

    @Test func waitersProceedOnATokenOrTimeOut() {
        var r = Registration(token: nil, deferred: true, retryInitialMs: 100, retryMaxMs: 400)
        #expect(r.wait(id: 1, now: 0, timeoutMs: 50).isEmpty)
        #expect(r.wait(id: 2, now: 10, timeoutMs: 500).isEmpty)
        #expect(r.nextDeadline() == 50)
        #expect(r.tick(now: 50) == [.timedOut([1])])
        _ = r.requestRegistration()
        r.failed(now: 60)
        #expect(r.nextDeadline() == 160)
        #expect(r.tick(now: 160) == [.register])
        #expect(r.succeeded(token: "t", now: 160) == [.ready([2])])
        #expect(r.wait(id: 3, now: 200, timeoutMs: 1) == [.ready([3])])
    }

    @Test func retriesBackOffToTheCap() {
        var r = Registration(token: nil, deferred: false, retryInitialMs: 100, retryMaxMs: 300)
        _ = r.start()
        var delays: [Int64] = []
        var t: Int64 = 0
        for _ in 0..<4 {
            r.failed(now: t)
            let next = r.nextDeadline()!
            delays.append(next - t)
            t = next
            #expect(r.tick(now: t) == [.register])
        }
        #expect(delays == [100, 200, 300, 300])
    }

    /// A refused credential: one registration at a time, rebinding owed on success, waiters
    /// after the rebind, and no second re-registration within `minReregisterIntervalMs`.
    @Test func aLostCredentialRegistersAgainOnceAndRebinds() {
        var r = Registration(token: "a", deferred: false, checkIntervalMs: 0, minReregisterIntervalMs: 5000)
        #expect(r.lost(.credentialRejected, now: 10) == [.register])
        #expect(r.token == nil && r.phase == .registering)
        #expect(r.lost(.credentialRejected, now: 20).isEmpty, "one re-registration in flight")
        #expect(r.wait(id: 7, now: 20, timeoutMs: 10_000).isEmpty)
        #expect(r.succeeded(token: "b", now: 40) == [.rebind, .ready([7])])
        #expect(r.reregistrations == 1 && r.lastReregisterMs == 10 && r.reason == .credentialRejected)
        #expect(r.lost(.tokenUnknown, now: 100).isEmpty, "within minReregisterIntervalMs")
        #expect(r.nextDeadline() == 5010)
        #expect(r.tick(now: 5010) == [.register])
        #expect(r.succeeded(token: "c", now: 5020) == [.rebind])
        #expect(r.reregistrations == 2 && r.reason == .tokenUnknown)
    }

    /// The periodic check registers again with the token held: the same answer changes
    /// nothing; another token (the backend lost ours) asks for a rebind.
    @Test func thePeriodicCheckFindsAReplacedToken() {
        var r = Registration(token: nil, deferred: false, checkIntervalMs: 1000)
        #expect(r.start() == [.register])
        #expect(r.succeeded(token: "a", now: 0).isEmpty)
        #expect(r.nextDeadline() == 1000)
        #expect(r.tick(now: 999).isEmpty)
        #expect(r.tick(now: 1000) == [.register])
        #expect(r.succeeded(token: "a", now: 1001).isEmpty)
        #expect(r.reregistrations == 0 && r.lastCheckMs == 1000)
        #expect(r.tick(now: 2001) == [.register])
        #expect(r.succeeded(token: "b", now: 2002) == [.rebind])
        #expect(r.reason == .tokenReplaced && r.reregistrations == 1)
    }

    /// A failed attempt after a loss backs off, but never sooner than the interval allows.
    @Test func aFailedReregistrationWaitsForTheInterval() {
        var r = Registration(token: "a", deferred: false, retryInitialMs: 100, retryMaxMs: 400, minReregisterIntervalMs: 1000)
        #expect(r.lost(.credentialRejected, now: 0) == [.register])
        r.failed(now: 50)
        #expect(r.nextDeadline() == 1000)
        #expect(r.tick(now: 1000) == [.register])
        #expect(r.reregistrations == 2)
    }
}

struct LiveActivityTests {
    @Test func repeatsAreFilteredByFilter() {
        var l = LiveActivities()
        let k = LiveActivities.Key(activityId: "a", pushToken: "t")
        #expect(l.decide(k, filter: .call) == .submit)
        #expect(l.decide(k, filter: .call) == .failRepeat, "in flight counts as a repeat")
        #expect(l.decide(k, filter: .abandon) == .dropSilently)
        #expect(l.decide(k, filter: .refuse) == .submit)
        l.finished(k, ok: false, appId: "x", schema: nil)
        #expect(l.decide(k, filter: .call) == .submit, "a failed submission is not a repeat")
        l.finished(k, ok: true, appId: "x", schema: nil)
        #expect(l.decide(k, filter: .call) == .failRepeat)
    }

    /// An activity is its first app's from the moment that app's bind is admitted: another
    /// app's bind cannot overtake one still in flight. A failed first bind frees it.
    @Test func anActivityIsClaimedWhileItsFirstBindIsInFlight() {
        var l = LiveActivities()
        let bank = LiveActivities.Key(activityId: "order", pushToken: "tokA")
        #expect(l.owner(of: "order") == nil)
        #expect(l.decide(bank, filter: .call) == .submit)
        l.claim("order", for: "bank")
        #expect(l.owner(of: "order") == "bank", "claimed while in flight")
        l.finished(bank, ok: false, appId: "bank", schema: nil)
        #expect(l.owner(of: "order") == nil, "a failed first bind frees the activity")
        #expect(l.decide(bank, filter: .call) == .submit)
        l.claim("order", for: "bank")
        l.finished(bank, ok: true, appId: "bank", schema: nil)
        #expect(l.owner(of: "order") == "bank" && l.claimed.isEmpty)
    }

    @Test func contentStateMustMatchTheSchema() {
        let s = ["score": "integer", "team": "string"]
        #expect(LiveActivities.mismatch(["score": 1, "team": "r"], s) == nil)
        #expect(LiveActivities.mismatch(["score": "1", "team": "r"], s) != nil)
        #expect(LiveActivities.mismatch(["score": 1], s) != nil)
        #expect(LiveActivities.mismatch(["score": 1, "team": "r", "x": true], s) != nil)
        #expect(LiveActivities.parseSchema(["a": "date"]) == nil)
    }
}
