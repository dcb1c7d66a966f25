import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// Every method the host serves carries a doc (`Bus.hostMethodDocs`), and no doc names a method
/// the host does not serve.
struct HostMethodDocTests {
    @Test func everyHostMethodIsDocumented() {
        let undocumented = HostMethod.served.filter { Bus.hostMethodDocs[$0] == nil }
        #expect(undocumented.isEmpty, "host methods without a doc: \(undocumented)")
        let stray = Bus.hostMethodDocs.keys.filter { !HostMethod.served.contains($0) }
        #expect(stray.isEmpty, "docs for methods the host does not serve: \(stray)")
        for n in HostMethod.served {
            let d = Bus.hostMethodDocs[n]
            #expect(d?.summary.isEmpty == false, "\(n): no summary")
            #expect(d?.hostChecksParams == false, "\(n): the host's own methods check their params themselves")
        }
        // The wire form (bus.describe's hostMethods) parses back as docs.
        for j in Bus.hostMethodsJSON {
            let o = j.objectValue ?? [:]
            #expect((try? MethodDoc.parse(o)) == Bus.hostMethodDocs[o["name"]?.stringValue ?? ""], "\(j.serialized)")
        }
    }
}
