import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// A batch's reply line without sockets: entries within `maxLineBytes` with room kept for the
/// members not answered yet, and the report cache's sharing and invalidation.
struct BatchLineTests {
    static func entry(_ n: Int) -> [UInt8] { Array(repeating: UInt8(ascii: "x"), count: n) }

    @Test func entriesGoInWhileTheyFitWithRoomKeptForTheOthers() {
        var b = BatchLine(limit: 10_000, members: 4)
        // Three members unanswered besides this one: 3 x 256 kept.
        #expect(b.fits(10_000 - 2 - 1 - 3 * BatchLine.entryReserve))
        #expect(!b.fits(10_000 - 1 - 1 - 3 * BatchLine.entryReserve))
        Self.entry(5000).withUnsafeBytes { b.add($0) }
        b.noEntry()  // a notification: its room is given back
        #expect(b.unanswered == 2)
        #expect(b.fits(10_000 - 5001 - 2 - 256) && !b.fits(10_000 - 5001 - 1 - 256))
        Self.entry(10).withUnsafeBytes { b.add($0) }
        Self.entry(20).withUnsafeBytes { b.add($0) }
        #expect(b.line.count == 1 + 5000 + 1 + 10 + 1 + 20 + 1)
        #expect(b.line.first == UInt8(ascii: "[") && b.line.last == UInt8(ascii: "]"))
        #expect(b.line.count <= b.limit)
    }

    @Test func anEmptyBatchLineHasNoEntries() {
        var b = BatchLine(limit: 1000, members: 2)
        b.noEntry()
        b.noEntry()
        #expect(b.isEmpty && b.unanswered == 0)
    }

    static func version(_ revision: UInt64, provided: UInt64 = 0) -> ReportCache.Version {
        ReportCache.Version(slots: [ReportCache.Mark(slot: ObjectIdentifier(Slot.self), revision: revision)], provided: provided)
    }
    final class Slot {}

    @Test func aDescribeIsBuiltOncePerVersionAndView() {
        var c = ReportCache()
        var builds = 0
        func get(_ view: ReportCache.DescribeView, _ v: ReportCache.Version) -> [UInt8] {
            c.describe(view, v) {
                builds += 1
                return Array("\(builds)".utf8)
            }
        }
        let first = get(.openrpc(all: false), Self.version(1))
        for _ in 0..<127 { #expect(get(.openrpc(all: false), Self.version(1)) == first) }
        #expect(builds == 1, "128 members, one build")
        #expect(get(.openrpc(all: true), Self.version(1)) != first, "another view is another text")
        #expect(get(.openrpc(all: false), Self.version(2)) != first, "a plugin changed: built again")
        #expect(get(.openrpc(all: false), Self.version(2, provided: 1)) != get(.openrpc(all: false), Self.version(2)))
        #expect(c.describeBuilds == builds)
    }

    @Test func aStatusSnapshotLastsOneTurnAndUntilAChange() {
        var c = ReportCache()
        var builds = 0
        func get(_ view: ReportCache.StatusView, turn: UInt64, revision: UInt64) -> [UInt8] {
            c.status(view, ReportCache.StatusStamp(turn: turn, revision: revision, version: Self.version(0))) {
                builds += 1
                return Array("\(builds)".utf8)
            }
        }
        let a = get(.all, turn: 1, revision: 0)
        #expect(get(.all, turn: 1, revision: 0) == a)
        #expect(get(.client(7), turn: 1, revision: 0) != a, "a client's own view is its own")
        #expect(get(.all, turn: 1, revision: 1) != a, "a change: a new snapshot")
        let b = get(.all, turn: 2, revision: 1)
        #expect(b != a && get(.all, turn: 2, revision: 1) == b, "a new turn: a new snapshot, shared in it")
        // Own views kept in one turn are bounded; past the bound each is built.
        for id in 0..<UInt64(ReportCache.maxStatusViews + 10) { _ = get(.client(100 + id), turn: 3, revision: 1) }
        let n = builds
        _ = get(.client(100 + UInt64(ReportCache.maxStatusViews) + 5), turn: 3, revision: 1)
        #expect(builds == n + 1)
    }
}
