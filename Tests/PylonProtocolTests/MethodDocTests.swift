import PylonCore
import PylonProtocol
import Testing

/// Method docs in the `bus.hello` manifest (`MethodDoc`), the host's param check
/// (`paramProblem`) and the OpenRPC document built from them.
@Suite struct MethodDocTests {
    typealias P = MethodDoc.Param

    static let doc = MethodDoc(
        "Record an event",
        params: [P("eventName", .string, required: true, "the name"), P("property", .object, "properties"), P("n", .integer, "")],
        result: .init(.object, "the completion", fields: [P("code", .integer, required: true, "0 is success")]),
        hostChecksParams: true)

    static func manifest() -> Manifest {
        var m = Manifest(name: "ma", version: "1.2")
        m.add(Manifest.Method(name: "eventRecord", consent: "ma:{appKey}", dropWhenDenied: true, deniedResult: ["code": 0], doc: doc))
        m.add(Manifest.Method(name: "status", doc: MethodDoc("Operator view", result: .init(.any, ""))))
        m.add(Manifest.Method(name: "undocumented"))
        m.callerInfo = true
        return m
    }

    @Test func docsRoundTripThroughTheHandshake() throws {
        let m = Self.manifest()
        let back = try Manifest.parse(m.helloParams(pid: 42))
        #expect(back == m)
        #expect(back.methods["ma.eventRecord"]?.doc == Self.doc)
        #expect(back.methods["ma.undocumented"]?.doc == nil)
        // bus.describe shows them too (without deniedResult).
        let described = m.json["methods"]?.arrayValue?.first { $0["name"] == "ma.eventRecord" }
        #expect(described?["summary"] == "Record an event")
        #expect(described?["params"]?.arrayValue?.first?["type"] == "string")
        #expect(described?["result"]?["fields"]?.arrayValue?.first?["name"] == "code")
        #expect(described?["deniedResult"] == nil)
    }

    /// An older plugin's manifest (names only, or consent only) still parses: no docs.
    @Test func manifestsWithoutDocsStillParse() throws {
        let hello: JSON = [
            "name": "old", "version": "0.1", "protocol": 1,
            "manifest": ["methods": ["a", ["name": "b", "consent": "old:{k}"]]],
        ]
        let m = try Manifest.parse(hello)
        #expect(m.methodOrder == ["old.a", "old.b"])
        #expect(m.methods.values.allSatisfy { $0.doc == nil })
    }

    /// A bad doc entry refuses the handshake with a message naming the method and the fault.
    @Test func badDocEntriesRefuseTheHandshake() {
        func refusal(_ entry: JSONObject) -> String? {
            var o = entry
            o["name"] = "m"
            let hello: JSON = ["name": "p", "protocol": 1, "manifest": ["methods": [.object(o)]]]
            do {
                _ = try Manifest.parse(hello)
                return nil
            } catch {
                #expect(error.code == RPCError.Code.invalidParams.rawValue)
                return error.message
            }
        }
        let result: JSON = ["type": "object", "description": ""]
        #expect(refusal(["params": [], "result": result])?.contains("summary (string) is required") == true)
        #expect(refusal(["summary": "s", "params": "x", "result": result])?.contains("params must be an array") == true)
        #expect(refusal(["summary": "s", "params": [["type": "string"]], "result": result])?.contains("params[0]: name") == true)
        let badType = refusal(["summary": "s", "params": [["name": "a", "type": "str"]], "result": result])
        #expect(badType?.contains("manifest.methods m: params[0] (a): type must be one of string") == true, "\(badType ?? "")")
        #expect(
            refusal(["summary": "s", "params": [["name": "a", "type": "string", "required": "yes"]], "result": result])?
                .contains("required must be a boolean") == true)
        #expect(
            refusal(["summary": "s", "params": [["name": "a", "type": "string"], ["name": "a", "type": "integer"]], "result": result])?
                .contains("a appears twice") == true)
        #expect(refusal(["summary": "s"])?.contains("result") == true)
        #expect(refusal(["summary": "s", "result": ["type": "tuple"]])?.contains("result.type") == true)
        #expect(refusal(["summary": "s", "result": result, "hostChecksParams": "on"])?.contains("hostChecksParams") == true)
        let many = JSON.array((0...MethodDoc.maxParams).map { ["name": .string("p\($0)"), "type": "string"] })
        #expect(refusal(["summary": "s", "params": many, "result": result])?.contains("more than \(MethodDoc.maxParams)") == true)
        #expect(refusal(["summary": "s", "params": [["name": "a", "type": "any"]], "result": result]) == nil)
    }

    @Test func paramProblemNamesTheParam() {
        let d = Self.doc
        func problem(_ params: JSON?) -> String? {
            let isObject = params?.objectValue != nil
            return d.paramProblem(isObject: isObject, isAbsent: params == nil || params == .null) { n in
                params?[n].map(MethodDoc.JSONType.of)
            }?.param
        }
        #expect(problem(["eventName": "x"]) == nil)
        #expect(problem(["eventName": "x", "property": ["a": 1], "n": 3, "extra": true]) == nil, "undeclared params pass")
        #expect(problem(["eventName": "x", "n": 3.0]) == nil, "a whole double is an integer")
        #expect(problem(["eventName": "x", "property": .null]) == nil, "a null optional param counts as absent")
        #expect(problem([:]) == "eventName")
        #expect(problem(nil) == "eventName", "absent params are {}")
        #expect(problem(["eventName": .null]) == "eventName", "null is not a required string")
        #expect(problem(["eventName": 5]) == "eventName")
        #expect(problem(["eventName": "x", "n": 2.5]) == "n")
        #expect(problem(["eventName": "x", "property": []]) == "property")
        #expect(problem(["x", 1]) == nil, "positional params are the plugin's to judge")
        let msg = d.paramProblem(isObject: true, isAbsent: false) { $0 == "eventName" ? .integer : nil }?.message
        #expect(msg == "params.eventName must be of type string, not integer")
        #expect(MethodDoc.JSONType.number.admits(5) && !MethodDoc.JSONType.integer.admits(0.5) && MethodDoc.JSONType.any.admits(.null))
    }

    /// The OpenRPC 1.2.6 shape: openrpc, info{title, version}, methods[{name, summary,
    /// params[{name, required, schema{type}}], result{name, schema}}].
    @Test func openRPCDocumentHasTheSpecifiedShape() {
        let m = Self.manifest()
        let entries = m.methodOrder.map { OpenRPC.Entry(name: $0, servedBy: "ma", consent: m.methods[$0]?.consent, doc: m.methods[$0]?.doc) }
        let d = OpenRPC.document(title: "Pylon", version: "0.1.0", methods: entries)
        #expect(d["openrpc"] == "1.2.6")
        #expect(d["info"]?["title"] == "Pylon" && d["info"]?["version"] == "0.1.0")
        let methods = d["methods"]?.arrayValue ?? []
        #expect(methods.count == 3)
        for method in methods {
            #expect(method["name"]?.stringValue != nil)
            #expect(method["params"]?.arrayValue != nil, "params is required, even empty")
            #expect(method["result"]?["name"]?.stringValue != nil && method["result"]?["schema"]?.objectValue != nil)
            for p in method["params"]?.arrayValue ?? [] {
                #expect(p["name"]?.stringValue != nil && p["required"]?.boolValue != nil && p["schema"]?.objectValue != nil)
            }
        }
        let ev = methods[0]
        #expect(ev["name"] == "ma.eventRecord" && ev["summary"] == "Record an event" && ev["x-pylon-consent"] == "ma:{appKey}")
        #expect(ev["params"]?.arrayValue?.first == ["name": "eventName", "required": true, "schema": ["type": "string"], "description": "the name"])
        #expect(ev["result"]?["schema"]?["properties"]?["code"]?["type"] == "integer")
        #expect(ev["result"]?["schema"]?["required"] == ["code"])
        #expect(methods[1]["result"]?["schema"]?["type"] == nil, "any: no type")
        #expect(methods[2]["summary"] == nil && methods[2]["params"] == [], "undocumented: listed, no params")
    }
}
