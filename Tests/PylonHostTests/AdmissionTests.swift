import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// Client admission without sockets: the connection and per-uid limits, the per-uid index, and
/// the refusal log's throttle on a fake clock.
struct AdmissionTests {
    final class Conn {}
    typealias Summary = Admission<Conn>.Summary

    static func limits(total: Int, perUid: Int) -> Limits {
        var l = Limits()
        l.maxConnections = total
        l.maxConnectionsPerUid = perUid
        return l
    }

    @Test func perUidLimitRefusesOnlyThatUid() {
        var a = Admission<Conn>()
        let l = Self.limits(total: 10, perUid: 2)
        let c1 = Conn(), c2 = Conn()
        #expect(a.decide(uid: 1000, shuttingDown: false, limits: l) == .accept)
        a.admit(c1, uid: 1000)
        a.admit(c2, uid: 1000)
        guard case .refuse(let name, let e) = a.decide(uid: 1000, shuttingDown: false, limits: l) else {
            Issue.record("third connection of uid 1000 admitted")
            return
        }
        #expect(name == "maxConnectionsPerUid" && e.code == RPCError.Code.overloaded.rawValue)
        #expect(e.message == "too many connections from uid 1000 (limit 2)")
        #expect(e.data?["limit"] == "maxConnectionsPerUid" && e.data?["value"] == .int(2))
        #expect(a.decide(uid: 1001, shuttingDown: false, limits: l) == .accept, "another uid still gets in")
        #expect(a.decide(uid: nil, shuttingDown: false, limits: l) == .accept, "unknown credentials: no per-uid count")
        a.remove(c1, uid: 1000)
        #expect(a.decide(uid: 1000, shuttingDown: false, limits: l) == .accept, "a closed one frees its slot")
        #expect(a.members(ofUid: 1000).count == 1 && a.members(ofUid: 1000)[0] === c2)
    }

    /// The per-uid output bound: the uid's connections holding the most go first, until the uid
    /// is within its limit; one that reads (holds nothing) and other uids are never named.
    @Test func aUidOverItsOutputBoundLosesItsLargestHoldersFirst() {
        var a = Admission<Conn>()
        let reader = Conn(), small = Conn(), big = Conn(), bigToo = Conn(), other = Conn()
        for c in [reader, small, big, bigToo] { a.admit(c, uid: 65534) }
        a.admit(other, uid: 4242)
        let held: [ObjectIdentifier: Int] = [
            ObjectIdentifier(reader): 0, ObjectIdentifier(small): 300, ObjectIdentifier(big): 1000,
            ObjectIdentifier(bigToo): 1000, ObjectIdentifier(other): 1_000_000,
        ]
        let size = { (c: Conn) in held[ObjectIdentifier(c)]! }
        #expect(a.evictions(ofUid: 65534, limit: 2300, held: size).isEmpty, "within the limit")
        // 2,300 held, limit 2,000: one of the two largest (the earlier adopted) is enough.
        #expect(a.evictions(ofUid: 65534, limit: 2000, held: size).map(ObjectIdentifier.init) == [ObjectIdentifier(big)])
        #expect(
            a.evictions(ofUid: 65534, limit: 200, held: size).map(ObjectIdentifier.init) == [
                ObjectIdentifier(big), ObjectIdentifier(bigToo), ObjectIdentifier(small),
            ])
        // Nothing held by the reader: it is not named even when the rest cannot bring the uid under.
        #expect(!a.evictions(ofUid: 65534, limit: 0, held: size).contains { $0 === reader })
        #expect(a.evictions(ofUid: 4242, limit: 2_000_000, held: size).isEmpty)
    }

    @Test func totalLimitAndShutdown() {
        var a = Admission<Conn>()
        let l = Self.limits(total: 2, perUid: 5)
        let kept = [Conn(), Conn()]
        a.admit(kept[0], uid: nil)
        a.admit(kept[1], uid: 1)
        #expect(a.count == 2)
        guard case .refuse("maxConnections", let e) = a.decide(uid: 2, shuttingDown: false, limits: l) else {
            Issue.record("over the total limit")
            return
        }
        #expect(e.message == "too many connections (limit 2)")
        guard case .refuse("shuttingDown", let s) = Admission<Conn>().decide(uid: 2, shuttingDown: true, limits: l) else {
            Issue.record("admitted while shutting down")
            return
        }
        #expect(s.code == RPCError.Code.shuttingDown.rawValue)
        a.remove(kept[0], uid: nil)
        a.remove(kept[1], uid: 1)
        #expect(a.count == 0 && a.byUid.isEmpty, "an empty uid leaves the index")
    }

    @Test func theRefusalLogIsThrottledToOneLinePerWindow() {
        var a = Admission<Conn>()
        let w = Admission<Conn>.refusalLogMs
        // The first refusal after a quiet period is logged at once.
        #expect(a.refused("maxConnections", nowMs: 1_000) == .logNow(Summary(count: 1, byLimit: "maxConnections=1", total: 1)))
        // Within the window: one timer for the window's end, the rest only counted.
        #expect(a.refused("maxConnectionsPerUid", nowMs: 1_500) == .logAfter(ms: w - 500))
        #expect(a.logPending)
        #expect(a.refused("maxConnectionsPerUid", nowMs: 2_000) == .none)
        #expect(a.refused("maxConnections", nowMs: 3_000) == .none)
        #expect(a.refusedTotal == 4)
        #expect(
            a.logTimerFired(nowMs: 1_000 + w) == Summary(count: 3, byLimit: "maxConnections=1,maxConnectionsPerUid=2", total: 4))
        #expect(!a.logPending)
        // Right after a summary, the next refusal waits for a whole window again.
        #expect(a.refused("shuttingDown", nowMs: 1_000 + w + 1) == .logAfter(ms: w - 1))
        #expect(a.logTimerFired(nowMs: 1_000 + 2 * w) == Summary(count: 1, byLimit: "shuttingDown=1", total: 5))
        // After a quiet window: at once again.
        #expect(a.refused("maxConnections", nowMs: 10 * w) == .logNow(Summary(count: 1, byLimit: "maxConnections=1", total: 6)))
        #expect(a.logTimerFired(nowMs: 11 * w) == nil, "nothing refused since: no line")
    }
}
