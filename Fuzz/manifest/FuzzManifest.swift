import FuzzSupport
import PylonCore
import PylonHost
import PylonProtocol

/// Fuzz target (b): what the host reads from outside its own code. The input is parsed with
/// json-c (as the host parses every line and file) and the value handed to
/// `Manifest.parse` (a plugin's `bus.hello` params), `HostConfig.parse` (the config file) and
/// `ConsentStore.restore` (the persisted consent file).
///
/// Properties: nothing traps; a parsed manifest's methods are all in its namespace and every
/// method's consent template resolves without trapping; a restored consent store survives its
/// own snapshot unchanged.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let ref = try? JSONRef.parse(input, maxDepth: 64) else { return 0 }
    let j = ref.json

    if let m = try? Manifest.parse(j) {
        fuzzCheck(m.methodOrder.count == m.methods.count, "methodOrder and methods disagree")
        for name in m.methodOrder {
            fuzzCheck(name.hasPrefix(m.name + "."), "method \(name) outside namespace \(m.name)")
            let method = m.methods[name]!
            _ = method.consentKey(params: j["params"] ?? j)
            _ = method.consentKey { $0.isEmpty ? nil : $0 }
        }
        _ = m.json.serialized
    }

    if let c = try? HostConfig.parse(j) {
        for p in c.plugins { fuzzCheck(!p.name.isEmpty, "a plugin without a name was accepted") }
    }

    if case .success(let store) = ConsentStore.restore(j) {
        let again = ConsentStore.restore(store.snapshot)
        fuzzCheck(again == .success(store), "consent snapshot does not restore to the same store")
        _ = store.effective
    }
    return 0
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}
