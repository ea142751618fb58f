// A stand-in for the plugin SDK, of hostwire's own (no SDK is copied): what
// a browser test serves with --plugin-sdk. It hands the plugin Penpal from
// this server and says that it was loaded from here.
export { connect, WindowMessenger } from '/memizy/play/vendor/penpal-7.0.6.mjs';
export const SDK_NAME = 'hostwire-test-sdk';
document.body.dataset.sdk = SDK_NAME;
