import PylonCore
import PylonProtocol
import Testing

/// `Conformance`, the contract check of `pylonctl conformance`: declared methods compared from
/// OpenRPC documents built by `OpenRPC.document` (as `bus.describe` builds them), and answers
/// judged against the real plugin's.
@Suite struct ConformanceTests {
    typealias P = MethodDoc.Param

    static let codeMessage = MethodDoc.Result(.object, "", fields: [P("code", .integer, required: true, ""), P("message", .string, "")])

    static func doc(_ entries: [OpenRPC.Entry]) -> [String: JSON] {
        Conformance.methods(of: "push", in: OpenRPC.document(title: "t", version: "1", methods: entries))
    }

    static let bind = OpenRPC.Entry(
        name: "push.bind", servedBy: "push", doc: MethodDoc("Bind", params: [P("userId", .string, required: true, "")], result: codeMessage)
    )
    static let opens = OpenRPC.Entry(
        name: "push.openLogReport", servedBy: "push", consent: "push:opens",
        doc: MethodDoc("Opened", params: [P("userInfo", .object, required: true, "")], result: codeMessage))
    static let real = doc([bind, opens, .init(name: "echo.echo", servedBy: "echo")])

    @Test func onlyThePluginsOwnMethodsAreItsContract() {
        #expect(Set(Self.real.keys) == ["push.bind", "push.openLogReport"])
    }

    @Test func theSameContractHasNoFindings() {
        #expect(Conformance.compareDeclared(plugin: "push", reference: Self.real, candidate: Self.real).isEmpty)
    }

    @Test func aMissingMethodFailsNamingIt() {
        let f = Conformance.compareDeclared(plugin: "push", reference: Self.real, candidate: Self.doc([Self.bind]))
        #expect(f.map(\.description) == ["FAIL push.openLogReport: missing: the real push serves it (Opened)"])
    }

    @Test func aWrongResultTypeFailsNamingTheMethod() {
        var b = Self.bind
        b.doc?.result = .init(.string, "")
        let f = Conformance.compareDeclared(plugin: "push", reference: Self.real, candidate: Self.doc([b, Self.opens]))
        #expect(f.map(\.description) == ["FAIL push.bind: result is declared string; the real one answers object"])
    }

    @Test func paramsMembersConsentAndUndeclaredMethodsAreCompared() {
        var b = Self.bind
        b.doc?.params = [P("userId", .integer, required: true, ""), P("extra", .string, required: true, "")]
        b.doc?.result = .init(.object, "", fields: [P("code", .string, ""), P("message", .string, "")])
        var o = Self.opens
        o.consent = "push:{appKey}"
        let undocumented = OpenRPC.Entry(name: "push.openLogReport", servedBy: "push")
        let f = Conformance.compareDeclared(plugin: "push", reference: Self.real, candidate: Self.doc([b, o])).map(\.description)
        #expect(
            f == [
                "FAIL push.bind: param userId is declared integer; the real one takes string",
                "FAIL push.bind: requires param extra, which the real one does not take (callers never send it)",
                "FAIL push.bind: result member code is declared string; the real one's is integer",
                "FAIL push.bind: result member code is optional; the real one always has it",
                "FAIL push.openLogReport: consent switch push:{appKey} where the real push has push:opens",
            ])
        let u = Conformance.compareDeclared(plugin: "push", reference: Self.real, candidate: Self.doc([Self.bind, undocumented]))
        #expect(u.count == 1 && u[0].method == "push.openLogReport" && u[0].message.hasPrefix("declares no summary"))
        let extra = OpenRPC.Entry(name: "push.more", servedBy: "push", doc: MethodDoc("More", result: .init(.any, "")))
        let w = Conformance.compareDeclared(plugin: "push", reference: Self.real, candidate: Self.doc([Self.bind, Self.opens, extra]))
        #expect(w.map(\.level) == [.warn] && w[0].method == "push.more")
    }

    @Test func probesCallBadParamsOnBothAndParamlessMethodsOnTheCandidate() {
        let status = OpenRPC.Entry(name: "push.status", servedBy: "push", doc: MethodDoc("S", result: .init(.object, "")))
        let p = Conformance.probes(reference: Self.doc([Self.bind, status]))
        #expect(p.map(\.method) == ["push.bind", "push.bind", "push.status"])
        #expect(p[0].params == .object([:]) && p[0].compare && p[0].what == "params {} (userId missing)")
        #expect(p[1].params == ["userId": 7] && p[1].compare && p[1].what == "params.userId of type integer")
        #expect(p[2].params == .object([:]) && !p[2].compare)
    }

    @Test func answersAreJudgedAgainstTheRealOnes() {
        let probe = Conformance.probes(reference: Self.real).first { $0.method == "push.bind" }!
        let schema = Self.real["push.bind"]!["result"]!["schema"]!
        func judge(_ r: Conformance.Outcome?, _ c: Conformance.Outcome) -> [String] {
            Conformance.judge(probe, plugin: "push", reference: r, candidate: c, schema: schema).map(\.description)
        }
        let refused: Conformance.Outcome = .result(["code": 3012, "message": "NEED_USERID"])
        #expect(judge(refused, .result(["code": 3012])) == [])
        #expect(
            judge(refused, .result(["code": 0]))
                == [
                    #"FAIL push.bind: params {} (userId missing): answers result {"code":0}; the real push answers result {"code":3012,"message":"NEED_USERID"}"#
                ])
        #expect(judge(.error(code: -32602, message: "x"), .error(code: -32602, message: "y")) == [])
        #expect(judge(.error(code: -32602, message: "x"), .error(code: -32603, message: "y")).count == 1)
        #expect(
            judge(refused, .result("ok")) == [
                "FAIL push.bind: params {} (userId missing): the result is string, not object",
                #"FAIL push.bind: params {} (userId missing): answers result "ok"; the real push answers result {"code":3012,"message":"NEED_USERID"}"#,
            ])
        #expect(judge(refused, .noAnswer("error -32002")).map { $0.hasPrefix("WARN push.bind") } == [true])
    }

    @Test func shapes() {
        let schema: JSON = [
            "type": "object", "properties": ["code": ["type": "integer"], "lastError": ["type": "string"]], "required": ["code"],
        ]
        #expect(Conformance.shapeProblem(schema: schema, value: ["code": 0, "lastError": .null]) == nil)
        #expect(Conformance.shapeProblem(schema: schema, value: ["lastError": "x"]) == "has no member code")
        #expect(Conformance.shapeProblem(schema: schema, value: ["code": 0, "lastError": 5]) == "member lastError is integer, not string")
        #expect(Conformance.shapeProblem(schema: schema, value: [1, 2]) == "is array, not object")
        #expect(Conformance.shapeProblem(schema: .object([:]), value: "anything") == nil)
    }
}
