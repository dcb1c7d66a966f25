@testable import PylonPluginKit
import Testing

/// The plugin kit's deferred raw methods, as the uploader uses them for `uploader.enqueue`.
struct PluginKitDeferredTests {
    @Test func deferredMethodIsAnnouncedWithItsConsentTemplate() {
        let p = Plugin(name: "kit", version: "1")
        p.deferredRawMethod("put", consent: "{consent}", dropWhenDenied: true, deniedResult: ["dropped": true]) { $0.reply(serialized: Array("1".utf8)) }
        p.rawMethod("echo") { Array($0) }
        p.method("plain") { $0.reply(.null) }
        let m = p.manifest
        #expect(m.methodOrder == ["kit.put", "kit.echo", "kit.plain"])
        #expect(m.methods["kit.put"] == Manifest.Method(name: "kit.put", consent: "{consent}", dropWhenDenied: true, deniedResult: ["dropped": true]))
        #expect(m.methods["kit.echo"]?.consent == nil)
    }
}
