// The page's one renderer of tokens: every cell of a strip (a reference token shaded by its
// top-2 margin, its top-k on hover) and both continuations after a divergence, drawn from
// the page's embedded data (its JSON block) with textContent, never as markup. Prompts that
// diverge are drawn at load, the others when opened, so a 2,000-prompt golden opens at once.
(function () {
  var data = JSON.parse(document.getElementById('data').textContent);
  var pieces = data.pieces || {};
  var VISIBLE = {' ': '\u00b7', '\n': '\u23ce', '\t': '\u21e5', '\r': '\u21a4'};
  var CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029]/g;
  function hex(c) { return '\\x' + ('0' + c.charCodeAt(0).toString(16)).slice(-2); }
  // a token's text (its id when the tokenizer was not at hand); visible: spaces and line
  // breaks drawn (a cell), control characters escaped either way
  function piece(id, visible) {
    var text = pieces[String(id)];
    if (text === undefined) return '#' + id;
    if (visible) text = text.replace(/[ \n\t\r]/g, function (c) { return VISIBLE[c]; });
    text = text.replace(CONTROL, hex);
    return text === '' ? '#' + id : text;
  }
  function shade(m, band) {
    if (m === null || m === undefined) return '#eef1f4';
    var x = Math.min(m / Math.max(3 * band, 1e-9), 1);
    return 'hsl(' + Math.round(8 + 40 * x) + ',90%,' + Math.round(58 + 40 * x) + '%)';
  }
  function title(p, i) {
    var token = p.reference[i], m = p.margins[i];
    var lines = ['position ' + i + ': ' + JSON.stringify(piece(token)) + ' (id ' + token + ')'];
    if (p.topk[i] && p.topk[i].length) {
      lines.push('reference top-k (logprob, nats):');
      p.topk[i].forEach(function (e) {
        lines.push('  ' + JSON.stringify(piece(e[0])) + ' ' + e[0] + ': ' + e[1].toFixed(4));
      });
    }
    lines.push('top-2 margin: ' + (m === null || m === undefined ? 'unknown'
                                   : m.toFixed(4) + ' nats')
               + (p.ties.indexOf(i) >= 0 ? ' (exact tie)' : ''));
    if (p.fork !== null && i === p.fork) {
      var c = p.candidate[i];
      lines.push('FIRST DIVERGENCE: ' + data.candidate_label + ' took '
                 + (c === undefined ? 'nothing (it stopped)'
                    : JSON.stringify(piece(c)) + ' (id ' + c + ')'));
    }
    return lines.join('\n');
  }
  function cell(p, i, band) {
    var s = document.createElement('span'), m = p.margins[i];
    s.className = 't' + (p.ties.indexOf(i) >= 0 ? ' tie' : '')
      + (p.fork !== null && i === p.fork ? ' fork' : '')
      + (p.fork !== null && i > p.fork ? ' after' : '');
    s.dataset.i = String(i);
    s.dataset.m = m === null || m === undefined ? '' : String(m);
    s.style.background = shade(m, band);
    s.textContent = piece(p.reference[i], true);
    s.title = title(p, i);
    return s;
  }
  function seq(p, tokens) {
    var div = document.createElement('div'), ctx = document.createElement('span');
    div.className = 'seq';
    ctx.className = 'ctx';
    ctx.textContent = '... ' + tokens.slice(Math.max(0, p.fork - 12), p.fork)
      .map(function (t) { return piece(t); }).join('');
    div.appendChild(ctx);
    var after = tokens.slice(p.fork);
    if (after.length) {
      var first = document.createElement('span');
      first.className = 'first';
      first.textContent = piece(after[0]);
      div.appendChild(first);
      div.appendChild(document.createTextNode(after.slice(1).map(
        function (t) { return piece(t); }).join('')));
    } else {
      var end = document.createElement('em');
      end.textContent = '(ends here)';
      div.appendChild(document.createTextNode(' '));
      div.appendChild(end);
    }
    return div;
  }
  function draw(el) {
    if (el.dataset.drawn) return;
    var g = data.goldens[+el.dataset.golden], p = g.prompts[+el.dataset.index];
    var band = g.band_nats || 0.5;
    var strip = el.querySelector('.strip') || el.appendChild(document.createElement('div'));
    strip.className = 'strip';
    for (var i = 0; i < p.reference.length; i++) strip.appendChild(cell(p, i, band));
    el.querySelectorAll('.side').forEach(function (side) {
      side.appendChild(seq(p, side.dataset.side === 'reference' ? p.reference : p.candidate));
    });
    el.dataset.drawn = '1';
  }
  document.querySelectorAll('.legend .t[data-m]').forEach(function (s) {
    s.style.background = shade(s.dataset.m === 'confident' ? Infinity : +s.dataset.m, 0.5);
  });
  document.querySelectorAll('details.prompt').forEach(function (el) {
    if (el.hasAttribute('data-lazy')) {
      el.addEventListener('toggle', function () { if (el.open) draw(el); });
    } else {
      draw(el);
    }
  });
  document.documentElement.dataset.ready = '1';  // the page's own script ran to its end
})();
