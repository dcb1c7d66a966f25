import PylonClientKit
import PylonProtocol
import PylonTesting
import TestSupport
import Testing

/// The Swift test kit (`PylonTesting`), tested by using it: a private host with a real plugin
/// and a fake push an "app" binds its user with.
@Suite struct PylonTestingTests {
    /// The app under test: binds its user for push messages.
    static func login(socket: String, user: String) throws -> JSON {
        try SyncClient(path: socket).call("push.bind", ["userId": .string(user)], timeoutMs: 10_000)
    }

    @Test func aFakePushBesideARealPlugin() throws {
        let host = try PrivateHost(plugins: [.real("echo")], buildDir: binDir)
        let push = try host.fake("push", answers: ["push.bind": .success(["code": 0, "message": ""])])
        #expect(try Self.login(socket: host.socket, user: "alice") == ["code": 0, "message": ""])
        #expect(push.calls("push.bind").map { $0.params?["userId"] } == [.string("alice")])
        push.answer("push.bind", .failure(RPCError(.overloaded, "queue full")))
        #expect(throws: RPCError.self) { try Self.login(socket: host.socket, user: "bob") }
        #expect(push.calls().count == 2)
        #expect(try host.call("echo.echo", ["a": 1]) == ["a": 1])
        #expect(try host.pluginState("echo") == "running")
    }
}
