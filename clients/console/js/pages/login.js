import {h} from '../dom.js';
import {login, loginWithToken} from '../api.js';
import {field, input, status} from '../ui.js';

export function render({root, navigate}) {
  const name = input('name', {id: 'login-name', autocomplete: 'username', required: true});
  const password = input('password', {id: 'login-password', type: 'password', autocomplete: 'current-password'});
  const token = input('token', {id: 'login-token', type: 'password', autocomplete: 'off'});
  const st = status();
  const submit = h('button', {type: 'submit', id: 'login-submit'}, 'Log in');
  const useToken = h('input', {type: 'checkbox', id: 'login-use-token'});
  const accountFields = h('div', null, field('Name', name), field('Password', password));
  const tokenFields = h('div', {hidden: true}, field('Operator token', token, 'The bootstrap credential (--operator-token-file); acts as the admin "operator".'));
  useToken.addEventListener('change', () => {
    accountFields.hidden = useToken.checked;
    tokenFields.hidden = !useToken.checked;
    name.required = !useToken.checked;
  });

  const form = h('form', {class: 'login-form', id: 'login-form', autocomplete: 'on'},
    h('h1', null, 'Pylon console'),
    h('p', {class: 'muted'}, 'Sign in with an operator account.'),
    accountFields, tokenFields,
    h('label', {class: 'check'}, useToken, ' Use the operator token instead'),
    submit, st);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    submit.disabled = true;
    try {
      if (useToken.checked) {
        await loginWithToken(token.value);
      } else {
        await login(name.value, password.value);
      }
      password.value = '';
      token.value = '';
      navigate('#/dashboard');
    } catch (e) {
      if (e.code === 'rate_limited') {
        const secs = Math.ceil(Number((e.body && e.body.retryAfterMs) || 60000) / 1000);
        st.fail({code: 'rate_limited', message: `Too many failed attempts; try again in ${secs} s.`});
      } else if (e.code === 'bad_credentials') {
        st.fail({code: 'bad_credentials', message: 'Wrong name or password.'});
      } else {
        st.fail(e);
      }
    } finally {
      submit.disabled = false;
    }
  });
  root.appendChild(h('div', {class: 'login-wrap'}, form));
  name.focus();
}
