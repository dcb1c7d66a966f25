import PylonCore
import Testing

@testable import PylonTagEngine

@Suite struct MacroTests {
    let env: TagEnvironment = {
        var e = TagEnvironment()
        e.language = "IT"
        e.osVersion = "6.1.0"
        e.appName = "Kiosk"
        e.appVersion = "2.3"
        e.appId = "com.example.kiosk"
        e.platform = "linux"
        e.deviceName = "Acme Box"
        e.deviceType = "desktop"
        e.resolution = "1920x1080"
        e.sdkVersion = "pylon-gtm 0.1.0"
        e.runtimeVersion = "1"
        return e
    }()

    func m(_ fn: String, _ extra: JSONObject = [:]) -> Container {
        var o: JSONObject = ["function": .string(fn), "instance_name": "x"]
        for (k, v) in extra { o[k] = v }
        return container(macros: [.object(o)])
    }

    @Test func constant() {
        #expect(value(m("_c", ["value": "hello"]), "x") == "hello")
        #expect(value(m("_c", ["value": 5]), "x") == 5)
        let c = m("_c")
        let e = c.value(named: "x", context: ctx())
        #expect(e.value == nil)
        #expect(e.warnings.contains { $0.contains("Incorrect keys") && $0.contains("value") })
    }

    @Test func dataLayerVariableFollowsDottedPaths() {
        let c = m("_v", ["name": "user.profile.level", "default_value": "none"])
        #expect(value(c, "x", ctx(["user": ["profile": ["level": 3]]])) == 3)
        #expect(value(c, "x", ctx()) == "none", "missing → default_value")
        #expect(value(m("_v", ["name": "a.b"]), "x", ctx(["a": 1])) == nil, "a non-map on the way")
    }

    @Test func eventMacro() {
        #expect(value(m("_e"), "x", ctx(event: "openScreen")) == "openScreen")
        #expect(value(m("_e"), "x") == nil)
    }

    @Test func deviceFactsComeFromTheEnvironment() {
        let cx = ctx(env: env)
        #expect(value(m("_an"), "x", cx) == "Kiosk")
        #expect(value(m("_av"), "x", cx) == "2.3")
        #expect(value(m("_ai"), "x", cx) == "com.example.kiosk")
        #expect(value(m("_l"), "x", cx) == "it", "language is lower-cased")
        #expect(value(m("_ov"), "x", cx) == "6.1.0")
        #expect(value(m("_p"), "x", cx) == "linux")
        #expect(value(m("_dn"), "x", cx) == "Acme Box")
        #expect(value(m("_dt"), "x", cx) == "desktop")
        #expect(value(m("_rs"), "x", cx) == "1920x1080")
        #expect(value(m("_sv"), "x", cx) == "pylon-gtm 0.1.0")
        #expect(value(m("_rv"), "x", cx) == "1")
        #expect(value(m("_an"), "x", ctx()) == nil, "unknown facts are unresolved")
    }

    @Test func containerVersionTimeRandom() {
        #expect(value(m("_ctv"), "x") == "7")
        #expect(value(m("_t"), "x") == .int(1_700_000_000_000))
        var seen = Set<Int64>()
        for s in 0..<200 {
            var cx = ctx()
            cx.seed = UInt64(s)
            let r = value(m("_r"), "x", cx)!.intValue!
            #expect(r >= 0 && r <= 2_147_483_646)
            seen.insert(r)
        }
        #expect(seen.count > 190)
        var a = ctx(); a.seed = 9
        #expect(value(m("_r"), "x", a) == value(m("_r"), "x", a), "deterministic per seed")
    }

    @Test func functionCallMacroAsksAndUsesTheAnswer() {
        let c = m("_func", ["function_call_macro_name": "price", "additional_params": ["currency": "EUR"]])
        var cx = ctx()
        let unregistered = c.value(named: "x", context: cx)
        #expect(unregistered.value == nil)
        #expect(unregistered.warnings.contains { $0.contains("No function-call macro handler registered for price") })
        cx.registeredMacros = ["price"]
        let first = c.value(named: "x", context: cx)
        #expect(first.value == nil)
        #expect(first.pending == [FunctionCallRequest(name: "price", parameters: ["currency": "EUR"])])
        cx.functionResults[first.pending[0].key] = 9.99
        #expect(c.value(named: "x", context: cx).value == 9.99)
        cx.functionResults[first.pending[0].key] = .null
        #expect(c.value(named: "x", context: cx).value == nil, "a failed handler → default")
        let bad = m("_func", ["function_call_macro_name": "price", "additional_params": "nope"]).value(named: "x", context: cx)
        #expect(bad.value == nil)
        #expect(bad.warnings.contains { $0.contains("not a map") })
    }

    @Test func joiner() {
        #expect(value(m("_jn", ["arg0": ["a", "b", 3]]), "x") == "a,b,3")
        #expect(value(m("_jn", ["arg0": ["list", "a", "b"], "item_separator": "|"]), "x") == "a|b")
        #expect(value(m("_jn", ["arg0": ["k": "v", "n": 1], "key_value_separator": ":", "item_separator": ";"]), "x") == "k:v;n:1")
        #expect(value(m("_jn", ["arg0": "solo"]), "x") == "solo")
    }

    @Test func simpleMap() {
        let full = container(macros: [
            [
                "function": "_smm", "instance_name": "x", "arg0": ["macro", 1],
                "map": [["key": "it", "value": "Ciao"], ["key": "es", "value": "Hola"]], "default_value": "Hello",
            ],
            ["function": "_l", "instance_name": "lang"],
        ])
        var e = TagEnvironment()
        e.language = "es"
        #expect(value(full, "x", ctx(env: e)) == "Hola")
        e.language = "fr"
        #expect(value(full, "x", ctx(env: e)) == "Hello")
        #expect(value(m("_smm", ["arg0": "a", "map": ["a": 1]]), "x") == 1, "a map works too")
    }

    @Test func regexGroup() {
        #expect(value(m("_reg", ["arg0": "order-1234-x", "arg1": "order-(\\d+)"]), "x") == "1234")
        #expect(value(m("_reg", ["arg0": "order-1234-x", "arg1": "(ORDER)-(\\d+)", "group": 2, "ignore_case": true]), "x") == "1234")
        #expect(value(m("_reg", ["arg0": "nothing", "arg1": "(\\d+)", "default_value": "none"]), "x") == "none")
        #expect(value(m("_reg", ["arg0": "abc", "arg1": "(b)", "group": 9]), "x") == nil)
    }

    @Test func encodeAndHash() {
        #expect(value(m("_enc", ["arg0": "hi"]), "x") == "6869")
        #expect(value(m("_enc", ["arg0": "hello?", "output_format": "base64"]), "x") == "aGVsbG8/")
        #expect(value(m("_enc", ["arg0": "hello?", "output_format": "base64url"]), "x") == "aGVsbG8_")
        #expect(value(m("_enc", ["arg0": "6869", "input_format": "base16", "output_format": "base64nopad"]), "x") == "aGk")
        #expect(value(m("_hsh", ["arg0": "abc"]), "x") == "900150983cd24fb0d6963f7d28e17f72")
        #expect(value(m("_hsh", ["arg0": "abc", "algorithm": "SHA-1"]), "x") == "a9993e364706816aba3e25717850c26c9cd0d89d")
        #expect(
            value(m("_hsh", ["arg0": "abc", "algorithm": "SHA-256"]), "x")
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            value(m("_hsh", ["arg0": "", "algorithm": "SHA-256"]), "x")
                == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            value(m("_hsh", ["arg0": .string(String(repeating: "a", count: 1000)), "algorithm": "MD5"]), "x")
                == "cabe45dcc9ae5b66ba86600cca6b8ba8")
        #expect(value(m("_hsh", ["arg0": "abc", "algorithm": "CRC"]), "x") == nil)
    }

    @Test func unknownFunctionIdWarnsAndDefaults() {
        let c = m("_nope")
        #expect(c.warnings.contains { $0.contains("_nope has no backing implementation") })
        let e = c.value(named: "x", context: ctx())
        #expect(e.value == nil)
        #expect(e.converted(to: .string).value == "")
        #expect(e.warnings.contains { $0.contains("_nope has no backing implementation") })
    }

    @Test func unknownMacroNameWarns() {
        let e = container().value(named: "ghost", context: ctx())
        #expect(e.value == nil)
        #expect(e.warnings == ["Invalid macro: ghost"])
    }

    @Test func predicateFunctionAsMacroWarns() {
        let e = m("_eq", ["arg0": 1, "arg1": 1]).value(named: "x", context: ctx())
        #expect(e.value == nil)
        #expect(e.warnings.contains { $0.contains("not a macro function") })
    }
}
