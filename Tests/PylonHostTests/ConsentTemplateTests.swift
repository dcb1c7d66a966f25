import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// Consent templates, taken apart once (`ConsentTemplate`, which the router and
/// `Manifest.Method.consentKey` both use), answer what the template grammar says.
struct ConsentTemplateTests {
    /// The grammar as a straight scan of the template text: the oracle for the random test.
    static func scanned(_ t: String?, field: (String) -> String?) -> ConsentKey {
        guard let t else { return .none }
        guard t.contains("{") else { return .key(t) }
        var out = ""
        var rest = t[...]
        while let open = rest.firstIndex(of: "{") {
            out += rest[..<open]
            guard let close = rest[open...].firstIndex(of: "}") else { return .key(t) }
            let name = String(rest[rest.index(after: open)..<close])
            guard let v = field(name), !v.isEmpty else { return .unresolved }
            out += v
            rest = rest[rest.index(after: close)...]
        }
        out += rest
        return .key(out)
    }

    @Test func examples() {
        let fields = ["appKey": "abc", "consent": "bench:events", "empty": ""]
        let field: (String) -> String? = { fields[$0] }
        #expect(ConsentTemplate(nil).key(field: field) == ConsentKey.none)
        #expect(ConsentTemplate("analytics").key(field: field) == .key("analytics"))
        #expect(ConsentTemplate("ma:{appKey}").key(field: field) == .key("ma:abc"))
        #expect(ConsentTemplate("{consent}").key(field: field) == .key("bench:events"))
        #expect(ConsentTemplate("{missing}").key(field: field) == .unresolved)
        #expect(ConsentTemplate("x{empty}").key(field: field) == .unresolved)
        #expect(ConsentTemplate("a{appKey}b{c").key(field: field) == .key("a{appKey}b{c"), "an unclosed brace: the template")
        #expect(ConsentTemplate("a{missing}b{c").key(field: field) == .unresolved, "fields before it still count")
    }

    /// Random templates over the characters that matter (braces, a combining mark that joins a
    /// brace into another character) and random fields: the same answer as the straight scan,
    /// with the same fields asked for, and `Manifest.Method.consentKey` gives it too.
    @Test func agreesWithAStraightScan() {
        var rng = SplitMix64(seed: 0xc0_25e7)
        let alphabet = ["{", "}", "a", "b", ":", "é", "\u{301}", "{a}", "{b}", "{}"]
        var resolved = 0
        for _ in 0..<20_000 {
            let template = (0..<Int(rng.next() % 8)).map { _ in alphabet[Int(rng.next() % UInt64(alphabet.count))] }.joined()
            var values: [String: String] = [:]
            for name in ["a", "b", "", "a{b", "é"] where rng.next() % 3 != 0 {
                values[name] = rng.next() % 4 == 0 ? "" : "v\(rng.next() % 10)"
            }
            var askedMine: [String] = []
            var askedTheirs: [String] = []
            let mine = ConsentTemplate(template).key {
                askedMine.append($0); return values[$0]
            }
            let theirs = Self.scanned(template) {
                askedTheirs.append($0); return values[$0]
            }
            #expect(mine == theirs, "template \(template) fields \(values)")
            #expect(Manifest.Method(name: "p.m", consent: template).consentKey { values[$0] } == theirs)
            #expect(askedMine == askedTheirs, "template \(template)")
            if case .key = mine, template.contains("{") { resolved += 1 }
        }
        #expect(resolved > 1_000, "the fields must also resolve")
    }
}

struct PendingTableRemoveIfTests {
    @Test func removesOnlyWhatIsAccepted() {
        var t = PendingTable<String>()
        t.insert(1, "a", target: 1, deadlineMs: 100)
        t.insert(2, "b", target: 1, deadlineMs: 200)
        #expect(t.remove(1, if: { $0 == "x" }) == nil)
        #expect(t.count == 2, "refused: kept")
        #expect(t.remove(1, if: { $0 == "a" }) == "a")
        #expect(t.remove(1, if: { _ in true }) == nil, "gone")
        #expect(t.remove(3, if: { _ in true }) == nil)
        #expect(t.count == 1 && t[2] == "b" && t.nextDeadline() == 200)
    }
}
